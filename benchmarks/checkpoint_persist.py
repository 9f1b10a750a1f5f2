"""Where a checkpoint persist spends its time, and the persist before/after the hash-beside-write pipeline.

A CPU state of `--gb` GB (fp32 tensors of 64 MB, random) is snapshotted into a `SnapshotBuffer` and persisted
through `AsyncCheckpointer` (write, sha256, fsync, shard record, manifest commit) to each target directory, with
the storage code of this tree ("after", with each of `--threads`: 2 hashes beside one writer, 3 beside two) and
with the one of `--before-tree` ("before": write a chunk, then hash it, in one thread), alternating. The parts are
timed apart too: sha256 alone over the buffer, the writes alone without and with fsync.

    flock /tmp/frenzy-heavy.lock nice -n 10 python benchmarks/checkpoint_persist.py --gb 1.5 \
        --targets /work/persist-bench /dev/shm/persist-bench --reps 3 --out benchmarks/results/checkpoint_persist.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tasks.training import checkpoint as ck  # noqa: E402
from tasks.training.checkpoint.snapshot import SnapshotBuffer  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402

FIELDS = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}


def before_storage(tree: Path) -> type:
    """`Storage` of another checkout's storage.py (its write_stream takes no `threads`: ignored here)."""
    spec = importlib.util.spec_from_file_location("storage_before", tree / "tasks/training/storage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Before(mod.Storage):
        def write_stream(self, key, chunks, threads=1):  # noqa: ANN001, ANN201, ARG002
            return super().write_stream(key, chunks)

    return Before


def gil() -> None:
    """sha256 of 1 GiB in one thread, in two threads of 512 MiB, and beside a pure-Python thread spinning on the GIL
    (if an update held the GIL, the spinner could not run meanwhile)."""
    data = memoryview(os.urandom(1 << 30))

    def work(part: memoryview) -> None:
        h = hashlib.sha256()
        for i in range(0, len(part), 16 << 20):
            h.update(part[i:i + (16 << 20)])

    for _ in range(2):
        t = time.perf_counter()
        work(data)
        print(f"one thread, 1 GiB: {time.perf_counter() - t:.3f} s")
        t = time.perf_counter()
        ths = [threading.Thread(target=work, args=(data[k << 29:(k + 1) << 29],)) for k in range(2)]
        [th.start() for th in ths]
        [th.join() for th in ths]
        print(f"two threads, 512 MiB each: {time.perf_counter() - t:.3f} s")
    spins, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    t = time.perf_counter()
    work(data)
    took = time.perf_counter() - t
    stop.set()
    th.join()
    print(f"one thread, 1 GiB, beside a spinning Python thread: {took:.3f} s; it spun {spins[0]:,} times meanwhile")


def parts(buf: SnapshotBuffer, target: Path, chunk: int) -> dict[str, float]:
    """sha256 alone; the writes alone without and with fsync (one thread, `chunk` bytes a write)."""
    out = {}
    t = time.perf_counter()
    h = hashlib.sha256()
    for c in buf.chunks(chunk):
        h.update(c)
    out["hash_s"] = time.perf_counter() - t
    for sync in (False, True):
        p = target / "parts.bin"
        t = time.perf_counter()
        with open(p, "wb") as f:
            for c in buf.chunks(chunk):
                f.write(c)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        out["write_fsync_s" if sync else "write_s"] = time.perf_counter() - t
        p.unlink()
        if not sync:
            os.sync()  # the next measurement starts with no dirty pages of this one
    return out


def two_at_once(buf: SnapshotBuffer, target: Path) -> dict[str, float]:
    """Two shards of this buffer persisted one after the other, then at once (two threads): what two snapshot
    buffers persisting together would gain over the queue."""
    out = {}
    st = Storage(str(target))
    for name in ("two_in_turn_s", "two_at_once_s"):
        shutil.rmtree(target, ignore_errors=True)
        os.sync()
        t = time.perf_counter()
        if name == "two_in_turn_s":
            for k in "ab":
                st.write_stream(f"{k}.bin", buf.chunks, threads=2)
        else:
            ths = [threading.Thread(target=st.write_stream, args=(f"{k}.bin", buf.chunks, 2)) for k in "ab"]
            [th.start() for th in ths]
            [th.join() for th in ths]
        out[name] = time.perf_counter() - t
    return out


def persist(storage: Storage, tensors: list, threads: int) -> float:
    c = ck.AsyncCheckpointer(storage, 0, 1, run="bench", keep=1, nice=0, buffers=1)
    c.threads = threads
    c.save(1, tensors, FIELDS)
    c.close()
    return c.records[-1].persist_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.5)
    ap.add_argument("--targets", nargs="+", type=Path, default=[])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--before-tree", type=Path, default=Path("/work/main"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--two", action="store_true", help="also time two shards persisted in turn and at once")
    ap.add_argument("--gil", action="store_true", help="only time sha256 in one and two threads (the GIL)")
    a = ap.parse_args()
    if a.gil:
        gil()
        return
    n = int(a.gb * 1e9) // (64 << 20)
    torch.manual_seed(0)
    tensors = [(f"model.w{i}", torch.randn(16 << 20)) for i in range(n)]
    buf = SnapshotBuffer(tensors)
    buf.copy_from(tensors)
    Before = before_storage(a.before_tree)
    rows = []
    for target in a.targets:
        for rep in range(a.reps):
            target.mkdir(parents=True, exist_ok=True)
            row = {"target": str(target), "rep": rep, "gb": buf.nbytes / 1e9, "load1": os.getloadavg()[0]}
            row.update(parts(buf, target, 16 << 20))
            runs = [("before", Before, 1)] + [(f"after_t{t}", Storage, t) for t in a.threads]
            if rep % 2:
                runs.reverse()  # alternate the order
            for name, cls, w in runs:
                shutil.rmtree(target, ignore_errors=True)
                os.sync()
                row[f"{name}_s"] = persist(cls(str(target)), tensors, w)
            if a.two:
                row.update(two_at_once(buf, target))
            row["load1_end"] = os.getloadavg()[0]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            rows.append(row)
        shutil.rmtree(target, ignore_errors=True)
    summary = {}
    for target in a.targets:
        mine = [r for r in rows if r["target"] == str(target)]
        summary[str(target)] = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k.endswith("_s")}
    print(json.dumps(summary, indent=1))
    if a.out:
        a.out.write_text(json.dumps({"rows": rows, "median": summary, "cpu_count": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
