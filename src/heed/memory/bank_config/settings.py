"""A bank's configuration: which settings exist, their types, defaults and validation.

hindsight-client reads and writes a bank's settings as one flat map
(``GET / PATCH / DELETE .../banks/{bank_id}/config``, and the extra fields of
``create_bank``). This module is the one list of the settings heed honours
(:data:`SETTINGS`), how each value is checked (strict JSON types: ``0`` is not ``false``),
where it lives, its default, and the one rule for a name heed does not honour: **refused
by name** (:class:`InvalidInput`, 400), never stored and ignored. A Hindsight setting heed
does not implement (:data:`NOT_IMPLEMENTED`) is named as such; any other name is unknown.
Keys may also be written the Hindsight server's environment way
(``HINDSIGHT_API_RETAIN_EXTRACTION_MODE``).

Where a setting lives: most in the bank's ``config`` map (absent: the default); the reflect
mission in the bank's ``mission`` and the disposition traits in its ``disposition`` (the
profile fields ``create_bank`` has always written). A ``null`` value removes the bank's own
value, so the server's default applies again; a reset (:func:`reset`) removes them all.

What reads them: recall its retrieval switches (``enable_*``), ``recall_prefer_observations``
(the default of a recall that does not say), its size, ``recall_budget_function`` and the
``recall_budget_*`` numbers (:mod:`heed.memory.recall.budget`), and its ranking's weights
``recall_semantic_weight``, ``recall_speaker_weight`` and ``recall_temporal_weight``
(:mod:`heed.memory.recall.ranking`); retain ``retain_mission`` and
``retain_extraction_mode``; consolidation ``enable_observations``, ``observations_mission``,
``default_observation_scopes`` and ``consolidation_strategies``
(:mod:`heed.memory.learning.scopes`);
reflect the mission, the disposition and ``recall_max_tokens`` (the token budget of each
recall its agent makes); mental-model refreshes
``mental_model_min_refresh_interval_seconds`` (:mod:`heed.mental_models.refresh`); the budgets
of background LLM work ``llm_budget_tokens_per_hour`` and ``llm_budget_tokens_per_day``
(:mod:`heed.llm.budget`); the MCP tools ``mcp_enabled_tools`` (:func:`check_mcp_tool`).
Five defaults are the server's (``HEED_RETAIN_EXTRACTION``, ``HEED_OBSERVATIONS``,
``HEED_MENTAL_MODEL_MIN_REFRESH_INTERVAL_SECONDS``, ``HEED_LLM_BUDGET_TOKENS_PER_HOUR`` and
``_PER_DAY``): :class:`ServerDefaults`. Which value
applies to a bank (its own, else the default) is :mod:`heed.memory.bank_config.view`'s one
rule; everything above reads it there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from heed.errors import HeedError
from heed.memory.models import (
    DISPOSITION_DEFAULT,
    DISPOSITION_TRAITS,
    Bank,
    InvalidInput,
    default_disposition,
)
from heed.memory.recall.budget import (
    ADAPTIVE_MAX,
    ADAPTIVE_MIN,
    ADAPTIVE_RATIOS,
    BUDGET_SIZES,
    MAX_PER_ARM,
    MAX_TOKENS,
    BudgetFunction,
)
from heed.memory.recall.ranking import DEFAULT_WEIGHTS, WEIGHT_SETTINGS

__all__ = [
    "MCP_TOOLS",
    "NOT_IMPLEMENTED",
    "SETTINGS",
    "STRATEGY_NOT_IMPLEMENTED",
    "ConsolidationStrategy",
    "ObservationScopes",
    "ScopePattern",
    "ServerDefaults",
    "Setting",
    "ToolNotEnabled",
    "accepts",
    "apply",
    "check_mcp_tool",
    "check_value",
    "overrides",
    "reset",
    "validate",
]

#: Longest text setting (a mission), as for any free text heed accepts.
TEXT_CHARS: Final = 200_000
#: Longest tag, and most entries of any list a setting holds.
TAG_CHARS: Final = 256
LIST_ITEMS: Final = 64
#: The tools of heed's MCP server (:mod:`heed.mcp.tools`) a bank's ``mcp_enabled_tools``
#: may name. A tool added there is added here (a test keeps the two equal).
MCP_TOOLS: Final = (
    *("list_banks", "create_bank", "recall", "retain", "reflect", "start_turn"),
    *("list_mental_models", "get_mental_model", "create_mental_model", "refresh_mental_model"),
    *("list_directives", "create_directive", "update_directive", "delete_directive"),
)


def _integral(value: Any) -> Any:
    """JSON Schema's integer: ``3.0`` is one (and ``true`` or ``"3"`` are not)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Text = Annotated[str, Field(max_length=TEXT_CHARS)]
Tag = Annotated[str, Field(min_length=1, max_length=TAG_CHARS)]
TagList = Annotated[list[Tag], Field(max_length=LIST_ITEMS)]
Trait = Annotated[int, Field(ge=1, le=5), BeforeValidator(_integral)]
#: Candidates per recall arm (:mod:`heed.memory.recall.budget`): bounded, so no bank makes
#: a recall unbounded.
PerArm = Annotated[int, Field(ge=1, le=MAX_PER_ARM), BeforeValidator(_integral)]
#: The ``adaptive`` function's share of a recall's ``max_tokens`` (clamped after).
Ratio = Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS), BeforeValidator(_integral)]

ObservationScopes = (
    Literal["combined", "shared", "per_tag"]
    | Annotated[list[TagList], Field(max_length=LIST_ITEMS)]
)
"""How consolidation scopes observations (:mod:`heed.memory.learning.scopes`): a mode, or tag lists
(fnmatch globs allowed)."""


class ScopePattern(BaseModel):
    """One rule of a consolidation strategy: tag patterns and how they must match."""

    model_config = ConfigDict(strict=True, extra="forbid")

    tags: TagList | None = None
    tags_match: Literal["all", "any"] | None = None


#: The settings of Hindsight's consolidation strategies heed does not implement: given
#: ``null`` (as hindsight-client's model sends every unset field) they ask for the default,
#: which is what heed does; any other value is refused by name.
STRATEGY_NOT_IMPLEMENTED: Final = (
    "max_observations_per_scope",
    "consolidation_source_facts_max_tokens",
    "consolidation_source_facts_max_tokens_per_observation",
)


class ConsolidationStrategy(BaseModel):
    """The observations mission for the scopes its rules claim (the other settings of
    Hindsight's strategies are refused by name: heed does not implement them)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    scopes: Annotated[list[ScopePattern], Field(max_length=LIST_ITEMS)] | None = None
    observations_mission: Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_implemented(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        given = [name for name in STRATEGY_NOT_IMPLEMENTED if value.get(name) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: Hindsight strategy settings heed does not implement "
                "(heed's consolidation is sized by the server, HEED_CONSOLIDATION_*)"
            )
        return {k: v for k, v in value.items() if k not in STRATEGY_NOT_IMPLEMENTED}


Home = Literal["config", "mission", "disposition"]

#: What each ranking weight does (:mod:`heed.memory.recall.ranking`).
_WEIGHT_HELP: Final[Mapping[str, str]] = {
    "semantic": "share of the cosine in recall's blend of cosine and BM25 (0-1)",
    "speaker": "added to a recalled unit spoken by a person the query names",
    "temporal": "added to a recalled unit whose event or mention time is in the query's "
    "date window",
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: the type its value has (validated strictly), its default (``None`` with
    a server default: :class:`ServerDefaults`), where it lives, and what it does."""

    annotation: Any
    default: Any
    home: Home = "config"
    help: str = ""


SETTINGS: Final[Mapping[str, Setting]] = {
    "reflect_mission": Setting(Text, "", "mission", "who reflect answers as, and why"),
    **{
        f"disposition_{trait}": Setting(Trait, DISPOSITION_DEFAULT, "disposition", "1-5")
        for trait in DISPOSITION_TRAITS
    },
    "retain_mission": Setting(Text | None, None, help="what retain's extraction looks for"),
    "retain_extraction_mode": Setting(
        Literal["off", "concise", "verbose"], None, help="facts extracted at retain"
    ),
    "enable_observations": Setting(bool, None, help="consolidate retains into observations"),
    "observations_mission": Setting(Text | None, None, help="what observations keep"),
    "default_observation_scopes": Setting(ObservationScopes, "combined"),
    "consolidation_strategies": Setting(
        Annotated[list[ConsolidationStrategy], Field(max_length=LIST_ITEMS)], []
    ),
    "enable_text_search": Setting(bool, True, help="recall's keyword (BM25) arm"),
    "enable_temporal_retrieval": Setting(bool, True, help="recall's temporal arm"),
    "enable_graph_retrieval": Setting(bool, True, help="recall's entity graph arm"),
    "enable_reranking": Setting(bool, True, help="recall's rerank stage"),
    "recall_prefer_observations": Setting(
        bool, False, help="prefer_observations of a recall that does not say"
    ),
    "recall_budget_function": Setting(
        BudgetFunction,
        "fixed",
        help="how a recall's budget sizes it: fixed (recall_budget_fixed_*) or adaptive "
        "(recall_budget_adaptive_* of its max_tokens)",
    ),
    **{
        f"recall_budget_fixed_{budget}": Setting(
            PerArm,
            sizes[0],
            help=f"candidates per recall arm of a {budget} budget, with the fixed function",
        )
        for budget, sizes in BUDGET_SIZES.items()
    },
    **{
        f"recall_budget_adaptive_{budget}": Setting(
            Ratio,
            ratio,
            help=f"candidates per recall arm of a {budget} budget, with the adaptive "
            "function, as a share of the recall's max_tokens",
        )
        for budget, ratio in ADAPTIVE_RATIOS.items()
    },
    "recall_budget_min": Setting(
        PerArm, ADAPTIVE_MIN, help="fewest candidates per arm of the adaptive function"
    ),
    "recall_budget_max": Setting(
        PerArm, ADAPTIVE_MAX, help="most candidates per arm of the adaptive function"
    ),
    **{
        name: Setting(
            Annotated[float, Field(ge=low, le=high, allow_inf_nan=False)],
            getattr(DEFAULT_WEIGHTS, field),
            help=_WEIGHT_HELP[field],
        )
        for name, (field, low, high) in WEIGHT_SETTINGS.items()
    },
    "recall_max_tokens": Setting(
        Tokens | None,
        None,
        help="token budget of each recall reflect makes (null: 1024, 2048 or 4096 by the "
        "reflect's budget)",
    ),
    "mental_model_min_refresh_interval_seconds": Setting(
        Annotated[float, Field(ge=0, le=366 * 24 * 3600)],
        None,
        help="least seconds between two refreshes of a mental model (its trigger may say)",
    ),
    **{
        f"llm_budget_tokens_per_{window}": Setting(
            Annotated[int, Field(ge=1, le=10**12), BeforeValidator(_integral)] | None,
            None,
            help=f"background LLM tokens (extraction, consolidation, mental-model refreshes) "
            f"the bank may spend per {'clock hour' if window == 'hour' else 'UTC day'}; "
            "reached: background work waits for the next one (null: the server's default, "
            "else no budget)",
        )
        for window in ("hour", "day")
    },
    "mcp_enabled_tools": Setting(
        Annotated[list[Literal[MCP_TOOLS]], Field(max_length=LIST_ITEMS)] | None,  # type: ignore[valid-type]
        None,
        help="the MCP tools that may act on the bank (null: all)",
    ),
}

#: Each setting's validator: strict JSON types.
_ADAPTERS: Final[Mapping[str, TypeAdapter[Any]]] = {
    name: TypeAdapter(s.annotation, config=ConfigDict(strict=True)) for name, s in SETTINGS.items()
}

#: Hindsight's bank settings heed does not implement (hindsight-client 1.1.0's
#: ``update_bank_config`` and ``create_bank``), refused by name, with why where it helps.
NOT_IMPLEMENTED: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        (
            "retain_custom_instructions",
            "retain_chunk_size",
            "retain_structured_chunk_size",
            "retain_max_attachments_per_chunk",
            "retain_default_strategy",
            "retain_strategies",
            "retain_chunk_batch_size",
            "store_document_text",
        ),
        "heed's retain chunks and stores every document one way",
    ),
    **dict.fromkeys(("entity_labels", "entities_allow_free_form"), "heed has no entity labels"),
    **dict.fromkeys(
        (
            "max_observations_per_scope",
            "observation_scope_limits",
            "enable_auto_consolidation",
            "consolidation_use_decision_model",
            "consolidation_llm_parallelism",
            "consolidation_max_memories_per_round",
            "consolidation_llm_batch_size",
            "consolidation_source_facts_max_tokens",
            "consolidation_source_facts_max_tokens_per_observation",
        ),
        "heed's consolidation is sized by the server (HEED_CONSOLIDATION_*)",
    ),
    **dict.fromkeys(
        (
            "knowledge_page_default_trigger",
            "mental_model_refresh_use_decision_model",
            "mental_model_delta_use_decision_model",
        ),
        "not a bank setting in heed",
    ),
    **dict.fromkeys(
        (
            "reflect_source_facts_max_tokens",
            "reflect_default_options",
            "reflect_use_decision_model",
        ),
        "heed's reflect has no observation search or decision model",
    ),
    **dict.fromkeys(
        ("recall_include_chunks", "recall_chunks_max_tokens"),
        "in Hindsight they make reflect's recalls return source chunks; heed's reflect reads "
        "a memory's source with its expand tool (a recall asks for chunks with include.chunks)",
    ),
    **dict.fromkeys(
        ("llm_gemini_safety_settings", "memory_defense", "audit_log_enabled"),
        "heed has no such feature",
    ),
}

_ENV_PREFIX: Final = "HINDSIGHT_API_"


class ToolNotEnabled(HeedError):
    """An MCP tool the bank's ``mcp_enabled_tools`` does not list (HTTP 403)."""

    status_code = 403


@dataclass(frozen=True, slots=True)
class ServerDefaults:
    """The defaults the server's settings choose (``HEED_RETAIN_EXTRACTION``,
    ``HEED_OBSERVATIONS``, resolved by :func:`heed.memory.build_learning`;
    ``HEED_MENTAL_MODEL_MIN_REFRESH_INTERVAL_SECONDS``)."""

    retain_extraction_mode: str = "off"
    enable_observations: bool = False
    mental_model_min_refresh_interval_seconds: float = 0.0
    llm_budget_tokens_per_hour: int | None = None
    llm_budget_tokens_per_day: int | None = None


def _name(key: str) -> str:
    """*key* as a setting's name (the environment form ``HINDSIGHT_API_X`` is ``x``)."""
    return key[len(_ENV_PREFIX) :].lower() if key.startswith(_ENV_PREFIX) else key


def _problem(where: str, error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    return f"{where}{loc}: {first['msg']}"


#: Refused names an error lists (the rest are counted), and the characters shown of each.
_NAMES_SHOWN: Final = 10
_NAME_SHOWN: Final = 100


def _listed(names: list[str], sep: str) -> str:
    more = len(names) - _NAMES_SHOWN
    return sep.join(names[:_NAMES_SHOWN]) + (f"{sep}and {more} more" if more > 0 else "")


def validate(updates: Mapping[str, Any], *, where: str = "updates") -> dict[str, Any]:
    """*updates* checked, as ``{setting: value}`` (a value as stored, JSON-able; ``None``:
    back to the default). Raises :class:`InvalidInput` naming every key that is not a
    setting heed honours, else the first value of the wrong type (nothing is applied).
    A Hindsight setting heed does not implement given ``None`` asks for its default,
    which is what heed does: it is accepted and changes nothing (clients that send every
    field of their model, as a template's, send those as ``null``)."""
    named: dict[str, Any] = {}
    not_implemented: list[str] = []
    unknown: list[str] = []
    for key, value in updates.items():
        name = _name(key)
        if name in named:
            raise InvalidInput(f"{where}: {name} is given twice (as {key!r} too)")
        if name in SETTINGS:
            named[name] = value
        elif name in NOT_IMPLEMENTED:
            if value is not None:
                not_implemented.append(f"{key} ({NOT_IMPLEMENTED[name]})")
        else:
            unknown.append(repr(key[:_NAME_SHOWN]))
    if not_implemented or unknown:
        parts = []
        if not_implemented:
            parts.append(
                "Hindsight settings heed does not implement: " + _listed(not_implemented, "; ")
            )
        if unknown:
            parts.append(
                f"unknown settings: {_listed(unknown, ', ')} (heed's are {', '.join(SETTINGS)})"
            )
        raise InvalidInput(f"{where}: " + "; ".join(parts))
    out: dict[str, Any] = {}
    for name, value in named.items():
        out[name] = None if value is None else check_value(name, value, f"{where}.{name}")
    return out


def check_value(name: str, value: Any, where: str) -> Any:
    """*value* (not ``None``) checked as the setting *name*'s, as stored (JSON-able); an
    :class:`InvalidInput` naming the first problem at *where* (the field's path)."""
    adapter = _ADAPTERS[name]
    try:
        checked = adapter.validate_python(value)
    except ValidationError as exc:
        raise InvalidInput(_problem(where, exc)) from None
    out = adapter.dump_python(checked, mode="json", exclude_none=True)
    if name == "mcp_enabled_tools":
        out = list(dict.fromkeys(out))
    return out


def apply(bank: Bank, changes: Mapping[str, Any]) -> None:
    """Set the validated *changes* (:func:`validate`) on *bank* (``None``: the default)."""
    for name, value in changes.items():
        setting = SETTINGS[name]
        if setting.home == "mission":
            bank.mission = value or ""
        elif setting.home == "disposition":
            trait = name.removeprefix("disposition_")
            bank.disposition[trait] = DISPOSITION_DEFAULT if value is None else int(value)
        elif value is None:
            bank.config.pop(name, None)
        else:
            bank.config[name] = value


def reset(bank: Bank) -> None:
    """Remove every setting of *bank*'s own: the server's defaults apply again."""
    bank.config = {}
    bank.mission = ""
    bank.disposition = default_disposition()


def overrides(bank: Bank) -> dict[str, Any]:
    """The settings *bank* sets itself (a trait at the default is not one)."""
    out: dict[str, Any] = {}
    for name, setting in SETTINGS.items():
        if setting.home == "mission":
            if bank.mission:
                out[name] = bank.mission
        elif setting.home == "disposition":
            value = bank.disposition.get(name.removeprefix("disposition_"), DISPOSITION_DEFAULT)
            if value != DISPOSITION_DEFAULT:
                out[name] = value
        elif name in bank.config:
            out[name] = bank.config[name]
    return out


def accepts(name: str, value: Any) -> bool:
    """Whether *value* is one the setting *name* accepts (as :func:`validate` checks it)."""
    try:
        _ADAPTERS[name].validate_python(value)
    except ValidationError:
        return False
    return True


def check_mcp_tool(bank_id: str, enabled: Sequence[str] | None, tool: str) -> None:
    """Raise :class:`ToolNotEnabled` when the bank *bank_id* lists its MCP tools (*enabled*,
    its ``mcp_enabled_tools``: :class:`heed.memory.bank_config.view.BankSettings`) and
    *tool* is not one."""
    if enabled is not None and tool not in enabled:
        listed = ", ".join(enabled) if enabled else "none"
        raise ToolNotEnabled(
            f"the MCP tool {tool!r} is not enabled for bank {bank_id!r} "
            f"(its mcp_enabled_tools: {listed})"
        )
