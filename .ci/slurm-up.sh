#!/usr/bin/env bash
# Bring up a real single-node SLURM cluster on this machine for tests and CI.
#
# Installs Debian's slurm-wlm (slurmctld + slurmd) and munge, writes
# /etc/slurm/slurm.conf and /etc/slurm/gres.conf, starts munged, slurmctld and
# slurmd directly (containers here have no systemd) and waits until `sinfo`
# shows the node idle. Idempotent: a second run rewrites the config only if it
# changed, (re)starts a daemon only if the config changed or the daemon is down
# (slurmctld starts with -c: queued jobs are dropped), and waits again.
#
# Usage (as root):  .ci/slurm-up.sh
# Environment:
#   SLURM_UP_TIMEOUT_S  seconds to wait for the node to become idle (default 60)
#   SLURM_PARTITION     name of the single default partition (default debug)
#   SLURM_SKIP_APT=1    do not run apt-get (packages already installed)
#   SLURM_FAKE_GPUS     stand-in GPUs on the node (default: one per core, at least 1)
#
# Why the settings below (found on Debian 12, Slurm 22.05, Snakemake 9.27,
# snakemake-executor-plugin-slurm 2.8):
# - The config lives at /etc/slurm/slurm.conf. With SLURM_CONF pointing elsewhere,
#   the `srun` inside a job could not find it, so we use the compiled-in default.
# - proctrack/linuxproc and task/none: cgroup plugins need a writable cgroup
#   hierarchy and systemd, which containers lack.
# - No accounting storage, so `sacct` cannot answer. Snakemake must use
#   `--slurm-status-command squeue`, and MinJobAge keeps finished jobs visible to
#   squeue long enough for the plugin (and the tests) to see their final state.
# - GresTypes=gpu with fake GPUs whose File= is an existing regular file:
#   Slurm's gpu plugin silently drops a GPU that has no File (Flags=CountOnly
#   did not help), and then `--gpus=1` jobs never schedule. One per CPU, so
#   that batches of profiling jobs (one GPU each) run side by side, one per core.
set -euo pipefail

TIMEOUT_S="${SLURM_UP_TIMEOUT_S:-60}"
PARTITION="${SLURM_PARTITION:-debug}"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
GRES_CONF="$CONF_DIR/gres.conf"
# Stand in for /dev/nvidia<i>: the gpu GRES plugin only needs the paths to exist.
FAKE_GPU_DIR=/var/lib/slurm
LOG_DIR=/var/log/slurm

die() {
  echo "slurm-up: ERROR: $*" >&2
  exit 1
}
say() { echo "slurm-up: $*"; }

[[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts daemons)."

# --- 1. packages -------------------------------------------------------------
if [[ "${SLURM_SKIP_APT:-0}" != 1 ]] &&
  ! { command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null 2>&1; then
  say "installing slurm-wlm and munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm slurm-client munge >/dev/null
fi
for exe in slurmctld slurmd munged sinfo sbatch squeue scontrol; do
  command -v "$exe" >/dev/null || die "$exe not found after install; install slurm-wlm and munge."
done

# --- 2. munge -----------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  say "creating munge key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key
  else
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  # --force: a stale socket from an earlier, killed munged would stop it otherwise.
  su -s /bin/sh munge -c "/usr/sbin/munged --force" ||
    die "munged did not start; see /var/log/munge/munged.log"
  for _ in $(seq 1 20); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.25
  done
  munge -n | unmunge >/dev/null || die "munge round trip fails; see /var/log/munge/munged.log"
fi

# --- 3. config ----------------------------------------------------------------
NODE=$(hostname -s)
# At least 4 CPUs: the study's largest CPU request (train: threads 4) must fit a node, as
# it does on any cluster node; slurmd accepts a count above the hardware's only with
# SlurmdParameters=config_overrides (below). On a 2-core CI runner the jobs then share
# the cores, which slows them but changes nothing they compute.
CORES=$(nproc)
CPUS=$((CORES > 4 ? CORES : 4))
GPUS="${SLURM_FAKE_GPUS:-$CORES}"
[[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || die "SLURM_FAKE_GPUS must be a positive integer, got '$GPUS'."
# 85 % of total memory, rounded down to whole GiB: leaves room for the daemons
# and the snakemake process (slurmd drains a node that claims more than it has),
# and stays the same from run to run, so a rerun does not see a "changed" config
# (MemAvailable would, and would restart the daemons every time).
TOTAL_MB=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
REAL_MB=$((TOTAL_MB * 85 / 100 / 1024 * 1024))
((REAL_MB >= 1024)) || REAL_MB=$((TOTAL_MB * 85 / 100))
# Without accounting, slurmctld's own state is all there is: keep it in one place.
mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd "$LOG_DIR" /run/slurm "$FAKE_GPU_DIR"
new_gres="# Written by .ci/slurm-up.sh: stand-in GPUs (File must exist, see script)."
for ((i = 0; i < GPUS; i++)); do
  [[ -f "$FAKE_GPU_DIR/fake-gpu$i" ]] || : >"$FAKE_GPU_DIR/fake-gpu$i"
  new_gres+=$'\n'"NodeName=${NODE} Name=gpu File=${FAKE_GPU_DIR}/fake-gpu$i"
done

new_conf=$(
  cat <<EOF
# Written by .ci/slurm-up.sh: single-node test cluster. Do not edit by hand.
ClusterName=opcost-ci
# Loopback addresses: a container's hostname need not resolve.
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
# The main scheduler holds every job behind a higher-priority one that waits (a CPU
# job behind a job waiting for the one GPU); only the backfill pass, every bf_interval
# seconds (default 30), starts it. A short interval keeps the tests quick.
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# No accounting daemon: squeue and scontrol are the only status sources, so finished
# jobs must stay visible long enough for Snakemake's status poll and, after a
# pipeline run of many minutes, for the tests that read back every job of the run.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=7200
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=10
Waittime=0
GresTypes=gpu
# Jobs that ask for no memory would otherwise get the whole node, one at a time.
DefMemPerCPU=1024
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${REAL_MB} Gres=gpu:${GPUS} State=UNKNOWN
PartitionName=${PARTITION} Nodes=${NODE} Default=YES MaxTime=INFINITE DefaultTime=60 State=UP OverSubscribe=NO
EOF
)

changed=0
if [[ ! -f "$CONF" ]] || [[ "$(cat "$CONF")" != "$new_conf" ]]; then
  printf '%s\n' "$new_conf" >"$CONF"
  changed=1
fi
if [[ ! -f "$GRES_CONF" ]] || [[ "$(cat "$GRES_CONF")" != "$new_gres" ]]; then
  printf '%s\n' "$new_gres" >"$GRES_CONF"
  changed=1
fi
# A stray SLURM_CONF would make our own commands read a different file than the
# jobs' srun does.
unset SLURM_CONF

# --- 4. daemons ---------------------------------------------------------------
daemon_alive() { # $1 = pid file
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}
stop_daemon() { # $1 = pid file
  if daemon_alive "$1"; then
    local pid
    pid=$(cat "$1")
    kill "$pid"
    for _ in $(seq 1 40); do
      kill -0 "$pid" 2>/dev/null || return 0
      sleep 0.25
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
}
if [[ $changed == 1 ]]; then
  say "config changed: (re)starting slurmctld and slurmd"
  stop_daemon /run/slurm/slurmd.pid
  stop_daemon /run/slurm/slurmctld.pid
fi
if ! daemon_alive /run/slurm/slurmctld.pid; then
  say "starting slurmctld"
  # -c: clear saved job state, so a changed config cannot clash with old jobs.
  /usr/sbin/slurmctld -c || die "slurmctld did not start; see ${LOG_DIR}/slurmctld.log"
fi
if ! daemon_alive /run/slurm/slurmd.pid; then
  say "starting slurmd"
  /usr/sbin/slurmd || die "slurmd did not start; see ${LOG_DIR}/slurmd.log"
fi

# --- 5. wait for the node -----------------------------------------------------
say "waiting up to ${TIMEOUT_S}s for node ${NODE} to be idle"
deadline=$((SECONDS + TIMEOUT_S))
state=""
while ((SECONDS < deadline)); do
  daemon_alive /run/slurm/slurmctld.pid || { state="(slurmctld exited)" && break; }
  state=$(sinfo -h -n "$NODE" -o '%T' 2>/dev/null | head -n1 || true)
  case "$state" in
    idle | mixed | allocated) break ;;
    down* | drain* | *'*')
      # A node that came back after a restart can be left down; resume it.
      scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
      ;;
  esac
  sleep 1
done
case "$state" in
  idle | mixed | allocated) ;;
  *)
    reason=$(sinfo -h -n "$NODE" -o '%E' 2>/dev/null || true)
    # The daemons fork before reading all of their config, so a fatal config error
    # shows only in their logs: show the end of each.
    for log in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log"; do
      echo "--- last lines of $log:" >&2
      tail -n 5 "$log" >&2 2>/dev/null || true
    done
    die "node ${NODE} is '${state:-not reported}' after ${TIMEOUT_S}s (reason: ${reason:-none}).
  Fix the error shown above (see ${LOG_DIR}/), then rerun $0; 'slurmd -C' shows what the node really has."
    ;;
esac
say "ready: $(sinfo -h -o '%P %a %D %T %G' | head -n1)"
