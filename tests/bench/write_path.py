"""What one uncontended standalone ADD on the Kubernetes store goes through (issue 37's measures), on a
real kube-apiserver (tests/kubeup.py): the project modules it passes through and their lines, how often
the call changes from one IPAM module to another (a profiler's call/return events; frames outside ipam
folded into their ipam caller), and its operations on node-local files (the IPAM's state directory:
strace of a plugin process). Not a timed test: it prints one markdown table per tree.

    python -m tests.bench.write_path [TREE ...]    (default: this tree; a TREE is another checkout,
                                                    e.g. a git worktree of an older commit)"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests import kubeup
from tests.bench.ipam_scale import Pod, Pycni, Workload, call_env, network_config

REPO = Path(__file__).resolve().parents[2]
PROBE = r"""
import io, json, sys
from collections import Counter
env, stdin = json.loads(sys.argv[1]), sys.argv[2].encode()
from cni import skel
events, seen, last = [], Counter(), [None]
def mod(frame):
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.split(".")[0] == "ipam":
            return name
        frame = frame.f_back
    return None
def hook(frame, event, arg):
    if event not in ("call", "return"):
        return
    m = mod(frame)
    if m is not None and m != last[0]:
        if last[0] is not None:
            events.append(m)
        last[0] = m
out = io.BytesIO()
sys.setprofile(hook)
rc = skel.run("whereabouts", env, io.BytesIO(stdin), out)
sys.setprofile(None)
files = {m: sys.modules[m].__file__ for m in sys.modules if m.split(".")[0] in ("cni", "ipam")}
print(json.dumps({"rc": rc, "out": out.getvalue().decode(), "changes": events, "files": files}))
"""


def trace(tree: Path, tenant: kubeup.Tenant, scratch: Path, index: int) -> dict[str, object]:
    impl = Pycni(None, scratch=scratch)
    impl.setup(tenant, scratch)
    wl = Workload(pods=4, networks=1, nodes=1, concurrency=1, mode="shared")
    conf = network_config(impl, wl, 1)
    warm = call_env(impl, "ADD", Pod(index, tenant.namespace, "w"), 1, "node-0")
    env = {**call_env(impl, "ADD", Pod(index + 1, tenant.namespace, "t"), 1, "node-0"), "PYCNI_AGENT": "off"}
    env["PYTHONPATH"] = str(tree)
    run = [sys.executable, "-c", PROBE, json.dumps(env), conf.decode()]
    # the pool exists first (a first ADD creates it): the traced call is the common one
    subprocess.run([sys.executable, "-m", "cni", "whereabouts"], input=conf, cwd=tree, check=True,
                   env={**os.environ, **warm, "PYTHONPATH": str(tree), "PYCNI_AGENT": "off"},
                   capture_output=True)  # fmt: skip
    done = subprocess.run(run, cwd=tree, capture_output=True, check=True, env={**os.environ, **env})
    got = json.loads(done.stdout)
    assert got["rc"] == 0, got["out"]
    state = str(scratch / "state")
    log = scratch / "strace.log"
    third = {**call_env(impl, "ADD", Pod(index + 2, tenant.namespace, "s"), 1, "node-0"),
             "PYTHONPATH": str(tree), "PYCNI_AGENT": "off"}
    calls = ("trace=openat,flock,pread64,pwrite64,read,write,rename,renameat,unlink,unlinkat,mkdir,mkdirat,"
             "fsync,close,getdents64,newfstatat,fstat")
    subprocess.run(["strace", "-f", "-y", "-qq", "-o", str(log), "-e", calls, sys.executable, "-m", "cni",
                    "whereabouts"], input=conf, cwd=tree, check=True, env={**os.environ, **third},
                   capture_output=True)  # fmt: skip
    ops = [line for line in log.read_text().splitlines() if state in line]
    files = {m: Path(f) for m, f in dict(got["files"]).items() if f}
    lines = {m: sum(1 for _ in p.open()) for m, p in files.items()}
    changes = list(got["changes"])
    return {"lines": lines, "changes": changes, "file_ops": ops}


def table(tree: Path, res: dict[str, object]) -> str:
    lines: dict[str, int] = res["lines"]  # type: ignore[assignment]
    changes: list[str] = res["changes"]  # type: ignore[assignment]
    entered = Counter(changes)
    ipam = {m: n for m, n in lines.items() if m.startswith("ipam")}
    rows = [f"### {tree}", "", f"- project modules passed through: {len(lines)}, {sum(lines.values())} lines "
            f"(ipam: {len(ipam)} modules, {sum(ipam.values())} lines)",
            f"- IPAM module changes in one ADD: {len(changes)} among {len(entered)} modules; most entered: "
            + ", ".join(f"{m} {n}" for m, n in entered.most_common(6)),
            f"- node-local file operations: {len(res['file_ops'])}"]  # type: ignore[arg-type]
    rows += [f"  - {op[:160]}" for op in res["file_ops"]]  # type: ignore[attr-defined]
    rows += ["", "| module | lines |", "|---|---|"]
    rows += [f"| {m} | {n} |" for m, n in sorted(ipam.items())]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", type=Path, default=[REPO])
    args = ap.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is missing (apt-get install strace)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pycni-write-path-") as tmp:
        server = kubeup.KubeServer.start(Path(tmp))
        try:
            for n, tree in enumerate(args.trees):
                tenant = kubeup.Tenant(server, Path(tmp) / f"t{n}" / "kube", prefix="wp")
                print(table(tree, trace(tree.resolve(), tenant, Path(tmp) / f"t{n}", 10 * n)) + "\n")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
