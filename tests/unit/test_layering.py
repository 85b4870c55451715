"""The pure core stays pure: it loads no Kubernetes I/O (README, Code map)."""

import subprocess
import sys

CORE = (
    "app.groups",
    "app.admission",
    "app.resources",
    "app.packing",
    "app.contention",
    "app.scoring",
    "app.preemption_planner",
    "app.status",
    "app.events",
)


def test_core_modules_load_no_kubernetes_io() -> None:
    # A fresh interpreter: this test session has long imported everything.
    program = (
        f"import sys\nimport {', '.join(CORE)}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('app.', 'kubernetes', "
        "'urllib3')))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(CORE) <= set(loaded)
    io = [m for m in loaded if m.startswith(("app.kube", "kubernetes", "urllib3"))]
    assert io == [], f"the pure core loads Kubernetes I/O: {io}"
    # Nor the plumbing that runs the verbs.
    plumbing = {"app.extender", "app.gate", "app.arbiter", "app.routes", "app.server"}
    assert plumbing.isdisjoint(loaded)
