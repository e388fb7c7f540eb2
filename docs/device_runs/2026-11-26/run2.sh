python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=torch PYTHONUNBUFFERED=1
timeout 60 python3 .devtmp/torch_gpu.py loop > $OUT/torch_loop.log 2>&1; echo "loop rc=$?" >> $OUT/torch_loop.log
TORCH_LOGS=recompiles,graph_breaks timeout 120 python3 .devtmp/torch_gpu.py compiled > $OUT/torch_compiled.log 2>&1; echo "compiled rc=$?" >> $OUT/torch_compiled.log
tail -c 3000 $OUT/torch_loop.log; tail -c 6000 $OUT/torch_compiled.log
