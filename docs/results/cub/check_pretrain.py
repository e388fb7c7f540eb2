"""Does a re-pretrained CUB backbone reproduce the recorded one?

The run keys hold the settings, not the pretrained weights, so `--resume`
reuses the stored fine-tune runs on whatever network `<output>/pretrain/`
holds. Run this before resuming on a new machine: it pretrains (or loads)
the backbone into `<output>/pretrain/` and compares
  - its per-epoch validation accuracy with pretrain_0c237de16782e6ed.json,
  - two frozen-feature runs (one-hot and spectral k = 12, seed 0, about 20 s
    each) with their records in runs.jsonl (curves and test accuracy).
Exit status 0: reproduced (the stored fine-tune runs pair with new ones);
1: not (move the stored `finetune` runs out of `<output>/runs/` first).

Run it from the folder the cub-bits command runs from (the data paths in the
keys are `../shared/data/...`, relative, as typed):
    PYTHONPATH=<repo> python <repo>/docs/results/cub/check_pretrain.py results/cub
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(output):
    from ecoc_research.experiments import runner as runner_lib

    with open(os.path.join(HERE, "runs.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    with open(os.path.join(HERE, "pretrain_0c237de16782e6ed.json")) as f:
        old_pre = json.load(f)
    ft = next(r for r in recs if r["spec"]["protocol"] == "finetune")
    run = runner_lib.Runner(output, resume=True, verbose=0)
    start = time.perf_counter()
    pre = run.pretrained(runner_lib.RunSpec.from_dict(ft["spec"]))
    print(f"pretrain key {pre.key} ({time.perf_counter() - start:.0f} s)")
    print("recorded val accuracy per epoch", old_pre["val_accuracy_per_epoch"])
    print("new      val accuracy per epoch", pre.record["val_accuracy_per_epoch"])
    ok = (pre.key == old_pre["key"] and pre.record["val_accuracy_per_epoch"]
          == old_pre["val_accuracy_per_epoch"])
    # A scratch run store that shares the pretraining cache.
    check_dir = output.rstrip("/") + "_check"
    os.makedirs(os.path.join(check_dir, "runs"), exist_ok=True)
    link = os.path.join(check_dir, "pretrain")
    if not os.path.exists(link):
        os.symlink(os.path.abspath(os.path.join(output, "pretrain")), link)
    check = runner_lib.Runner(check_dir, resume=False, verbose=0)
    for encoding in ("one_hot", "spectral"):
        old = next(r for r in recs if r["spec"]["protocol"] == "retrain"
                   and r["spec"]["encoding"] == encoding
                   and r["spec"]["seed"] == 0
                   and r["spec"].get("code_length") in (None, 12))
        new = check.run(runner_lib.RunSpec.from_dict(old["spec"]))
        same = (new["val_accuracy"] == old["val_accuracy"]
                and new["test_accuracy"] == old["test_accuracy"])
        print(f"{encoding} frozen features, seed 0: test {old['test_accuracy']}"
              f" recorded, {new['test_accuracy']} now; curves identical: "
              f"{new['val_accuracy'] == old['val_accuracy']}")
        ok = ok and same
    print("REPRODUCED" if ok else "NOT REPRODUCED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "results/cub"))
