python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
KERAS_BACKEND=torch timeout 100 python3 .devtmp/final.py torch > $OUT/final_torch.log 2>&1; echo "rc=$?" >> $OUT/final_torch.log
grep -h '^{\|rc=' $OUT/final_torch.log
KERAS_BACKEND=torch timeout 45 python3 benchmarks/bench_streaming.py --fit-worker ecoc --fit-samples 8192 --fit-classes 100000 --device gpu > $OUT/final_fit.log 2>&1; echo "rc=$?" >> $OUT/final_fit.log
grep -h '^{\|rc=' $OUT/final_fit.log
