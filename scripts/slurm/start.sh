#!/usr/bin/env bash
# Starts a one-node Slurm cluster on this machine (Debian's slurmctld, slurmd and munge; as root, no systemd), so
# that jobs can be started with `srun` as most clusters start them. Idempotent: a running cluster is left alone.
# Installs the packages when they are missing (apt-get). Usage:
#   scripts/slurm/start.sh            # then: srun -n 4 --mpi=pmix ...
# Writes /etc/slurm/slurm.conf (one node: this host, CPUs and memory as configured below, oversubscribed so that 4
# ranks run on 2 cores), keeps state and logs under /var/spool/slurm-oomflight and /var/log/slurm-oomflight.
set -euo pipefail
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null ||
   ! command -v srun >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
host=$(hostname -s)
spool=/var/spool/slurm-oomflight
logs=/var/log/slurm-oomflight
mkdir -p /etc/slurm "$spool/ctld" "$spool/d" "$logs" /run/munge
# munge: the key the package made, the daemon as root (no systemd to start it).
[[ -s /etc/munge/munge.key ]] || mungekey --create --force >/dev/null
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
fi
munge -n | unmunge >/dev/null
# One node, 16 CPUs declared whatever the machine has (config_overrides keeps slurmd from draining it for that):
# jobs of up to 16 ranks oversubscribe the real cores, as `mpirun --oversubscribe` does.
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=oomflight
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$spool/ctld
SlurmdSpoolDir=$spool/d
SlurmctldPidFile=$spool/slurmctld.pid
SlurmdPidFile=$spool/slurmd.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
KillWait=5
InactiveLimit=0
MinJobAge=30
NodeName=$host CPUs=16 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
# Ready when the node takes jobs.
for _ in $(seq 60); do
  if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    echo "slurm: one node ($host) up: $(sinfo -h -o '%P %D %t %c CPUs')"
    exit 0
  fi
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm: the node did not come up; logs in $logs:" >&2
tail -20 "$logs/slurmctld.log" "$logs/slurmd.log" >&2 || true
exit 1
