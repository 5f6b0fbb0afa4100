"""The tables of scripts/lm_eval_check.sh (docs/EVAL.md).

    python scripts/lm_eval_report.py ab WORK PORT_SPECULATIVE PORT_TARGET_ALONE
        the servers' own time on the tasks' first 25 problems as lm-eval sends them, straight to
        each server, alternating, three rounds (no lm-eval process in the way)
    python scripts/lm_eval_report.py report WORK
        lm-eval's scores on both servers, its time, and whether every sample's answer agrees
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import urllib.request
from pathlib import Path

SERVERS = ("tiny-dflash", "target-alone")
TASKS = ("trtspec_arith_gen", "trtspec_arith_mc")


def _post(port: str, body: dict) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()


def ab(work: Path, ports: dict[str, str]) -> None:
    docs = [json.loads(line) for line in open(work / "tasks" / "arith.jsonl")][:25]
    kinds = {
        "score (echo, logprobs, 1 token)": [
            {"model": "trtspec", "prompt": [list(f"{d['context']} {c}".encode())], "temperature": 0,
             "max_tokens": 1, "logprobs": 1, "echo": True, "seed": 1234} for d in docs for c in d["choices"]],
        "generate (until a newline)": [
            {"model": "trtspec", "prompt": [list(f"Q: {d['question']}\nA:".encode())], "temperature": 0,
             "max_tokens": 64, "stop": ["\n"], "seed": 1234} for d in docs],
    }
    print("| requests | round | tiny-dflash ms/request | target alone ms/request | ratio |")
    print("|---|---:|---:|---:|---:|")
    for kind, bodies in kinds.items():
        for round_ in range(3):
            ms = {}
            for name in SERVERS:
                start = time.perf_counter()
                for body in bodies:
                    _post(ports[name], body)
                ms[name] = (time.perf_counter() - start) / len(bodies) * 1e3
            print(f"| {kind} | {round_ + 1} | {ms['tiny-dflash']:.1f} | {ms['target-alone']:.1f} | "
                  f"{ms['target-alone'] / ms['tiny-dflash']:.2f} |")


def _requests_s(work: Path, name: str, task: str) -> float:
    """From lm-eval's `Running ... requests` log line to its `Saving` line (1-second steps)."""
    stamps = [datetime.datetime.strptime(line[:19], "%Y-%m-%d:%H:%M:%S")
              for line in open(work / f"{name}-{task}.log") if "Running" in line or "Saving per-task" in line]
    return (stamps[-1] - stamps[0]).total_seconds()


def _samples(work: Path, name: str, task: str) -> list[dict]:
    found = sorted((work / name).rglob(f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in open(found[-1])]


def report(work: Path) -> None:
    seconds = {tuple(line.split()[:2]): float(line.split()[2]) for line in open(work / "seconds.txt")}
    print("| server | task | metric | score | lm_eval seconds | of which requests |")
    print("|---|---|---|---:|---:|---:|")
    for name in SERVERS:
        for path in sorted((work / name).rglob("results_*.json")):
            for task, scores in json.loads(path.read_text())["results"].items():
                for metric, value in scores.items():
                    if isinstance(value, float) and "stderr" not in metric:
                        print(f"| {name} | {task} | {metric} | {value:.3f} | {seconds[(name, task)]:.1f} | "
                              f"{_requests_s(work, name, task):.0f} |")
    for task in TASKS:
        a, b = _samples(work, SERVERS[0], task), _samples(work, SERVERS[1], task)
        same = sum(x["resps"] == y["resps"] for x, y in zip(a, b, strict=True))
        print(f"{task}: {same}/{len(a)} samples with identical responses on both servers")
        if task.endswith("mc"):  # resps: per choice [[loglikelihood, is_greedy]]
            gap = max(abs(float(r[0][0]) - float(s[0][0]))
                      for x, y in zip(a, b, strict=True) for r, s in zip(x["resps"], y["resps"], strict=True))
            print(f"{task}: largest loglikelihood difference {gap:.2e}")


if __name__ == "__main__":
    if sys.argv[1] == "ab":
        ab(Path(sys.argv[2]), dict(zip(SERVERS, sys.argv[3:5], strict=True)))
    else:
        report(Path(sys.argv[2]))
