"""heed."""

import os as _os

# One BLAS thread per caller. heed bounds CPU with lanes and offload threads; OpenBLAS's own
# pool would run beside them and, worse, its idle workers spin for tens of milliseconds after
# every matrix product (measured: 50-100 ms of CPU after each recall on 2 cores). Must be set
# before numpy is first imported, hence here; an explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")
