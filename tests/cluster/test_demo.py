"""`make demo`, the main job, runs to the end as its steps say it does.

hack/demo.py starts its own control plane (the local cluster's default,
gang-only mode) and extender, applies deploy/examples/ and exits 1 when a
step did not end as it says (a gang bound early, or not bound in time).
Here it runs beside the session's cluster: its own directory, ports 100
above the session's, stopped afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hack.clusterkit import REPO
from tests.cluster.session import GANG_ONLY, PORT_OFFSET, SLOT

pytestmark = pytest.mark.skipif(
    not GANG_ONLY,
    reason="the demo runs the local cluster's default (gang-only) mode: tested in the first pass",
)


def test_make_demo_ends_with_every_gang_placed_all_or_nothing() -> None:
    env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(REPO / ".local-cluster-tests" / f"demo-slot-{SLOT}"),
        "LOCAL_CLUSTER_PORT_OFFSET": str(PORT_OFFSET + 100),
        "DEMO_EXTENDER_PORT": str(18888 + PORT_OFFSET + 100),
    }
    demo = [sys.executable, str(REPO / "hack" / "demo.py")]
    try:
        run = subprocess.run(
            demo, env=env, cwd=REPO, capture_output=True, text=True, timeout=420, check=False
        )
    finally:
        subprocess.run([*demo, "--stop"], env=env, capture_output=True, check=False)
        subprocess.run(
            [str(REPO / "hack" / "local-cluster"), "down"],
            env=env,
            capture_output=True,
            check=False,
        )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "all four trainer pods bound together" in run.stdout
    assert "!!! expected" not in run.stdout
