#!/bin/bash
# Run a study on a GPU host that has no package registry (../shared/gpu-host/README.md):
# install the carried wheels (.whl/, built by ../shared/gpu-host/wheelhouse.sh), put the
# project on the path, run the pipeline with the local executor, one GPU job at a time.
#
#   bash tools/gpu_host_run.sh CONFIG [LIMIT_S] [extra snakemake arguments]
#
# LIMIT_S stops Snakemake (SIGTERM to it and its measurement worker, which unwinds the job
# it runs; SIGKILL 20 s later, as Snakemake's threads may not stop on SIGTERM) so that what
# was measured can be fetched; a second call resumes where the first stopped (the lock is
# released and a cut-off job's hidden temporary files removed). With $OUT set, results are
# packed there.
set -uo pipefail
config=${1:-config/config.yaml}
limit=${2:-540}
shift $(( $# < 2 ? $# : 2 ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,clocks.sm,clocks.mem --format=csv
start=$(date +%s)
timeout -s TERM -k 20 "$limit" python3 -m snakemake --configfile "$config" --cores 16 \
  --resources gpu=1 --keep-going "$@"
rc=$?
python3 -m snakemake --configfile "$config" --unlock >/dev/null 2>&1
find results -name '.*.tmp-*' -delete 2>/dev/null
echo "snakemake exit $rc after $(( $(date +%s) - start )) s"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/results.tar.gz" results logs .snakemake/log 2>/dev/null
  ls -la "$OUT"
fi
exit $rc
