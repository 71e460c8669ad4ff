// heed's browser UI entry point (plain ES module, no build step).

const status = document.getElementById("server-status");

async function checkHealth() {
  try {
    const response = await fetch("/health");
    const body = await response.json();
    status.textContent = body.status === "healthy" ? "server healthy" : "server unhealthy";
    status.className = body.status === "healthy" ? "status ok" : "status error";
  } catch (error) {
    status.textContent = "network lost";
    status.className = "status error";
  }
}

checkHealth();
