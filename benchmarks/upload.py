"""Code upload and per-trial overhead of the remote service, against a loopback OpenSSH server.

1. Upload: package and send a 2000-file / 250 MB code directory (1900 source-like text files and
   100 incompressible binaries) with trialflow's remote service (scan, content hash, tar stream over
   SSH, safe extraction), beside ``scp -r`` of the same directory in the same run. A first upload
   goes to an empty machine with no hash cache; an unchanged re-upload is what a second experiment
   pays. Target: first upload <= 1.0x scp; re-upload near zero.
2. Per-trial overhead: N trivial trials one after another (submit, then poll and wait as the
   experiment flow does, every 0.2 s) on the local service and on the remote service with and
   without reuse mode, minus the same trial run as a bare subprocess in the same run.

    python benchmarks/upload.py [--repeats 3] [--trials 50] [--mb 250]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import median_ms, print_table, summary_row, timed  # noqa: E402
from trialflow.experiments.context import ExperimentContext  # noqa: E402

POLL_INTERVAL = ExperimentContext.poll_interval
TRIAL_COMMAND = f"{sys.executable} trial.py"  # the same interpreter everywhere (the sshd is loopback)
TRIAL = "import nni\nnni.get_next_parameter()\nnni.report_final_result(1.0)\n"


def make_code_dir(root: Path, total_mb: int, files: int = 2000, binaries: int = 100) -> None:
    rng = random.Random(7)
    text_files = files - binaries
    text_bytes = 8 * 1024
    binary_bytes = (total_mb * 1024 * 1024 - text_files * text_bytes) // binaries
    line = b"def f(x):\n    return x * 2  # a line of ordinary source code\n"
    for i in range(text_files):
        path = root / f"pkg{i // 100}" / f"module_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((line * (text_bytes // len(line) + 1))[:text_bytes])
    for i in range(binaries):
        path = root / "weights" / f"shard_{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(binary_bytes))
    (root / "trial.py").unlink(missing_ok=True)


def scp_upload(server, source: Path, target: Path) -> None:
    subprocess.run(["scp", "-q", "-r", "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "BatchMode=yes",
                    "-i", str(server.key_file), "-P", str(server.port), str(source),
                    f"{server.user}@127.0.0.1:{target}"], check=True)


def remote_service(server, code: Path, workdir: Path, exp: Path, reuse: bool = False):
    from trialflow.config import RemoteConfig
    from trialflow.platforms.remote import RemoteTrainingService

    config = RemoteConfig(trial_command="python3 trial.py", trial_code_directory=code, reuse_mode=reuse,
                          known_hosts_file=server.known_hosts, machine_list=[{
                              "host": "127.0.0.1", "port": server.port, "user": server.user,
                              "ssh_key_file": server.key_file, "remote_working_directory": str(workdir),
                              "python_path": os.path.dirname(sys.executable)}])
    service = RemoteTrainingService(config, exp)
    service.prepare()
    return service


def upload_medians(server, tmp: Path, repeats: int, total_mb: int) -> tuple[float, float, float]:
    """Median seconds of (scp -r, trialflow's first upload, an unchanged re-upload)."""
    code = tmp / "bigcode"
    make_code_dir(code, total_mb)
    scp_times, first_times, again_times = [], [], []
    for r in range(repeats):
        target = tmp / f"scp-target-{r}"
        scp_times.append(timed(lambda t=target: scp_upload(server, code, t)))
        shutil.rmtree(target)
        exp = tmp / f"exp-first-{r}" / "E"  # a fresh hash cache (.cache beside the experiment)
        service = remote_service(server, code, tmp / f"remote-{r}", exp)
        first_times.append(timed(lambda s=service: s.upload_code(code)))
        assert service.uploaded_bytes > total_mb * 1024 * 1024
        service.close()
        again = remote_service(server, code, tmp / f"remote-{r}", exp.parent / "E2")
        again_times.append(timed(lambda s=again: s.upload_code(code)))
        assert again.uploaded_bytes == 0
        again.close()
        shutil.rmtree(tmp / f"remote-{r}")
    return statistics.median(scp_times), statistics.median(first_times), statistics.median(again_times)


def bench_upload(server, tmp: Path, repeats: int, total_mb: int) -> list[list[object]]:
    scp, first, again = upload_medians(server, tmp, repeats, total_mb)
    return [
        ["scp -r (baseline)", f"{scp * 1000:.0f}", "1.00x"],
        ["trialflow first upload", f"{first * 1000:.0f}", f"{first / scp:.2f}x"],
        ["trialflow unchanged re-upload", f"{again * 1000:.1f}", f"{again / scp:.3f}x"],
    ]


def _run_sequential(service, code_ref, code: Path, count: int, prefix: str) -> list[float]:
    from trialflow.platforms import TrialSpec

    times = []
    for i in range(count):
        spec = TrialSpec("E", f"{prefix}{i}", i, i, {}, TRIAL_COMMAND, code)
        start = time.perf_counter()
        handle = service.submit(spec, code_ref)
        cursor: dict = {}
        while True:
            update = service.poll(handle, cursor)
            cursor = update.cursor
            if update.status.is_terminal:
                break
            service.wait(handle, POLL_INTERVAL)
        assert update.status.value == "SUCCEEDED", update.message
        times.append(time.perf_counter() - start)
    return times


def bench_trials(server, tmp: Path, count: int) -> list[list[object]]:
    from trialflow.config import LocalConfig
    from trialflow.platforms.local import LocalTrainingService
    from trialflow.trial import NNI_SHIM_DIR, RUNTIME_ROOT

    code = tmp / "small"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([NNI_SHIM_DIR, RUNTIME_ROOT])}  # standalone trial
    bare = [timed(lambda: subprocess.run(["/bin/bash", "-c", TRIAL_COMMAND], env=env, check=True, cwd=code,
                                         capture_output=True)) for _ in range(count)]
    local = LocalTrainingService(LocalConfig(trial_command=TRIAL_COMMAND, trial_code_directory=code),
                                 tmp / "local-exp" / "E")
    local.prepare()
    results = {"bare subprocess": bare,
               "local": _run_sequential(local, local.upload_code(code), code, count, "L")}
    for reuse in (False, True):
        service = remote_service(server, code, tmp / "remote-trials", tmp / f"exp-{reuse}" / "E", reuse)
        name = "remote, reuse mode" if reuse else "remote, SSH per trial"
        results[name] = _run_sequential(service, service.upload_code(code), code, count, f"R{int(reuse)}x")
        service.close()
    base = statistics.median(bare)
    return [[name, f"{median_ms(t):.0f}", f"{(statistics.median(t) - base) * 1000:+.0f}"]
            for name, t in results.items()]


def summary(profile: str) -> list[list[object]]:
    """Rows for ``python -m benchmarks``: upload against scp, per-trial time against a bare subprocess."""
    from trialflow.testing.sshd import LoopbackSshd

    mb, count = (60, 10) if profile == "short" else (250, 50)
    with tempfile.TemporaryDirectory(prefix="trialflow-upload-") as tmp_name, LoopbackSshd() as server:
        tmp = Path(tmp_name)
        scp, first, again = upload_medians(server, tmp, 1 if profile == "short" else 3, mb)
        trials = bench_trials(server, tmp, count)
    name = f"upload (2000 files, {mb} MB)"
    rows = [summary_row(name, "first upload", first, "s", "scp -r", scp, 1.0),
            summary_row(name, "unchanged re-upload", again, "s", "scp -r", scp)]
    bare = float(trials[0][1])
    rows += [summary_row(f"per-trial time ({count} sequential)", str(where), float(ms), "ms", "bare subprocess", bare)
             for where, ms, _ in trials[1:]]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--mb", type=int, default=250)
    args = parser.parse_args()
    from trialflow.testing.sshd import LoopbackSshd

    with tempfile.TemporaryDirectory(prefix="trialflow-upload-") as tmp_name, LoopbackSshd() as server:
        tmp = Path(tmp_name)
        upload = bench_upload(server, tmp, args.repeats, args.mb)
        print_table(f"Upload of a 2000-file / {args.mb} MB code directory to 127.0.0.1 (median of {args.repeats})",
                    ["method", "ms", "vs scp"], upload)
        trials = bench_trials(server, tmp, args.trials)
        print_table(f"Per-trial time of {args.trials} trivial trials run one after another (median)",
                    ["where", "ms per trial", "overhead vs bare ms"], trials)


if __name__ == "__main__":
    main()
