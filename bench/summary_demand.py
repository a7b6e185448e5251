"""What a check asks of the module summaries it makes (issue 21, twentieth session).

    python bench/summary_demand.py TREE [TREE ...] [--jobs 1]

Runs `ampfix check --no-cache --select ALL -j JOBS TREE` in this process (the pool's workers are
forks of it) and prints, per tree:
- the summaries made (`Project._summarize`: count and process time, its parse included);
- the functions whose effects the summaries made (`Summarizer.effects`, time) against those
  whose effects a trace of another module read (`Events._inline_effects`): what making the
  effects on demand could save at most;
- which query first asked for each summary (`Project._summary`, the innermost frames of the
  model that led to it), most frequent first: where a text-level answer would have to stand
  in for the summary to avoid it.
With `--jobs 2` the counts are summed over the pool's processes (each writes its own file).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import traceback

sys.setrecursionlimit(20000)


def _instrument(out_dir: str) -> None:
    from ampfix.model import events as E
    from ampfix.model import summarize as S
    from ampfix.project import project as P

    def record(kind, payload):
        with open(os.path.join(out_dir, f"{os.getpid()}.jsonl"), "a") as fh:
            fh.write(json.dumps([kind, payload]) + "\n")

    effects = S.Summarizer.effects

    def timed_effects(self, func):
        t0 = time.process_time()
        try:
            return effects(self, func)
        finally:
            cls = self.model.class_of(func)
            qual = f"{cls.name.value}.{func.name.value}" if cls is not None else func.name.value
            record("made", [os.path.abspath(self.model.path), qual, time.process_time() - t0])

    S.Summarizer.effects = timed_effects

    inline = E.Events._inline_effects

    def read(self, trace, ff, *a, **k):
        record("read", [os.path.abspath(ff.path), ff.qual])
        return inline(self, trace, ff, *a, **k)

    E.Events._inline_effects = read

    summarize = P.Project._summarize

    def timed_summarize(self, path, source):
        t0 = time.process_time()
        try:
            return summarize(self, path, source)
        finally:
            record("summary", [os.path.abspath(path), time.process_time() - t0])

    P.Project._summarize = timed_summarize

    summary = P.Project._summary

    def asked(self, path):
        frames = [f for f in traceback.extract_stack(limit=60)
                  if "/ampfix/model/" in f.filename and not f.filename.endswith(("foreign.py", "guard.py"))]
        record("asked", " < ".join(f"{os.path.basename(f.filename)}:{f.name}" for f in reversed(frames[-3:])))
        return summary(self, path)

    P.Project._summary = asked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    for tree in args.trees:
        out_dir = tempfile.mkdtemp(prefix="ampfix-demand-")
        pid = os.fork()
        if pid == 0:  # a child per tree: the instrumentation and the run's state stay in it
            _instrument(out_dir)
            from ampfix.frontends import cli

            try:
                cli.main(["check", "--no-cache", "--select", "ALL", "-j", str(args.jobs), "-q", "-o", os.devnull,
                          tree], standalone_mode=False)
            except SystemExit:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        made: dict = {}
        read: set = set()
        summaries = []
        asked: collections.Counter = collections.Counter()
        for name in os.listdir(out_dir):
            with open(os.path.join(out_dir, name)) as fh:
                for line in fh:
                    kind, payload = json.loads(line)
                    if kind == "made":
                        key = (payload[0], payload[1])
                        made[key] = made.get(key, 0.0) + payload[2]
                    elif kind == "read":
                        read.add(tuple(payload))
                    elif kind == "summary":
                        summaries.append(payload[1])
                    else:
                        asked[payload] += 1
        spent = sum(made.values())
        spent_read = sum(v for k, v in made.items() if k in read)
        print(f"{os.path.basename(tree.rstrip('/'))} (-j {args.jobs}): {len(summaries)} summaries, "
              f"{sum(summaries):.3f} s; effects made for {len(made)} functions, {spent:.3f} s; "
              f"read by a trace: {len(read)} functions, whose effects took {spent_read:.3f} s")
        for where, n in asked.most_common(8):
            print(f"  {n:4d}  first asked by {where}")


if __name__ == "__main__":
    main()
