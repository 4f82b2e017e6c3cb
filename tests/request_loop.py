"""A CPU torch training loop that answers the agent's checkpoint requests, as docs/checkpoints.md tells a job to: it
trains a small model and, every ``--poll-steps`` steps, polls ``storwatch.training.checkpoint_requested(run_dir)`` (one
stat); when asked, it saves with ``atomic_save``. It saves once at the start (a run with a save, as a real run has),
prints ``ready`` when it starts polling and ``saved STEP START`` after each answer (START: its save's start), and ends
after ``--answers`` answers (or ``--seconds``), writing every poll's time and every answer to a JSON file.

Usage: python -m tests.request_loop RUN_DIR RESULT_JSON [--poll-steps N] [--answers K] [--seconds S]
       [--step-seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from storwatch.training import atomic_save, checkpoint_requested


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("result")
    ap.add_argument("--poll-steps", type=int, default=5)
    ap.add_argument("--answers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--step-seconds", type=float, default=0.01, help="a step's compute, slept (a loaded machine)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    atomic_save(model.state_dict(), os.path.join(args.run_dir, "step-0.pt"), step=0)
    polls: list[float] = []
    answers: list[dict[str, float | int]] = []
    print("ready", flush=True)
    step = 0
    end = time.monotonic() + args.seconds
    while len(answers) < args.answers and time.monotonic() < end:
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_seconds)
        step += 1
        if step % args.poll_steps:
            continue
        polled = time.time()
        polls.append(polled)
        if checkpoint_requested(args.run_dir):
            event = atomic_save(model.state_dict(), os.path.join(args.run_dir, f"step-{step}.pt"), step=step)
            answers.append({"poll": polled, "step": step, "start": event.start})
            print(f"saved {step} {event.start!r}", flush=True)
    with open(args.result, "w") as f:
        json.dump({"pid": os.getpid(), "polls": polls, "answers": answers, "steps": step}, f)


if __name__ == "__main__":
    main()
