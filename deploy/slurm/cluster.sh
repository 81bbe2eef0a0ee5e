#!/usr/bin/env bash
# A Slurm 22.05 cluster of several nodes on this one machine, for orch's real-Slurm tests and for trying orch.
#
#   deploy/slurm/cluster.sh up       install (if missing), configure, start, wait until usable (idempotent)
#   deploy/slurm/cluster.sh down     stop slurmd, slurmctld, slurmdbd, MariaDB and munged (state is kept)
#   deploy/slurm/cluster.sh status   one line per daemon, then sinfo; exit 0 iff the cluster is usable
#
# Debian 12 as root, no systemd; cgroup v1 memory for task/cgroup. Measured facts behind each setting are in
# ../shared/notes/slurm-dev-cluster.md and deploy/slurm/README.md. Everything orch's tests rely on:
#   partitions spot (default, preempted -> requeued in place), spot-cancel (preempted -> cancelled),
#   prio (preempts both), all on the node named as this host; 2 fake GPUs (gres with File=); memory enforced
#   by the job's memory cgroup (task/cgroup: a kernel OOM kill, sacct OUT_OF_MEMORY, as on real clusters);
#   sacct. Several nodes: this host's node and $EXTRA_NODES more (n2, n3, ...), each its own slurmd
#   (`slurmd -N <node>`, own port, spool, pid and log), in partitions multi (preempted -> requeued in place)
#   and multi-prio (preempts it). One kernel and one network namespace for all: see deploy/slurm/README.md.
# State lives under $ORCH_SLURM_STATE (default /var/lib/orch-slurm), config in /etc/slurm.
set -euo pipefail

STATE=${ORCH_SLURM_STATE:-/var/lib/orch-slurm}
CONF_DIR=/etc/slurm
CLUSTER=orchdev
HOST=$(hostname -s)
DB_PORT=${ORCH_SLURM_DB_PORT:-3307}   # our own MariaDB instance, so a system one is never touched
DB_SOCK=$STATE/run/mysqld.sock
RUN=$STATE/run
LOG=$STATE/log
GRACE_S=${ORCH_SLURM_GRACE_S:-10}
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge)
EXTRA_NODES=${ORCH_SLURM_EXTRA_NODES:-2}   # fake nodes beside this host's: n2 .. n<1+EXTRA_NODES>
[[ $EXTRA_NODES =~ ^[0-9]$ ]] || { echo "[cluster.sh] ERROR: ORCH_SLURM_EXTRA_NODES must be 0-9" >&2; exit 2; }
EXTRA_PORT0=6828                          # n2's slurmd listens on 6828, n3's on 6829, ...
HOSTS_MARK="# orch dev Slurm cluster (deploy/slurm/cluster.sh)"

nodes() {  # every node's name, this host's first
    local k
    echo "$HOST"
    for (( k = 2; k <= EXTRA_NODES + 1; k++ )); do echo "n$k"; done
}

# Start a daemon with none of this shell's open files above stderr. Tests run `cluster.sh up` under
# `flock /work/wt/slurm.lock` (and CI under its own locks): a slurmdbd restarted there inherited the lock's
# descriptor and held the cluster lock for as long as it ran, so every later `flock` waited for ever.
daemon() {
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
        done
        exec "$@"
    )
}

say() { printf '[cluster.sh] %s\n' "$*"; }
die() { printf '[cluster.sh] ERROR: %s\n' "$*" >&2; exit 1; }

pid_alive() {  # pid_alive PIDFILE -> 0 iff the daemon named by the file (slurmd.pid -> slurmd) runs
    local pid want
    [ -s "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    # After a reboot a stale pid file may name an unrelated process: check its name too.
    want=$(basename "$1" .pid); want=${want%%-*}  # slurmd-n2.pid -> slurmd
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$want" ]
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD... -> polls CMD every 0.5 s
    local limit=$1 what=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        if (( SECONDS - t0 >= limit )); then
            return 1
        fi
        sleep 0.5
    done
    say "$what after $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------------------------------------
install_packages() {
    local missing=()
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        || missing+=(slurm-wlm)
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v mariadbd >/dev/null || command -v mysqld >/dev/null || missing+=(mariadb-server)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # apt-get update only when the package lists cannot serve the install (none yet, or stale).
    if ! apt-cache show "${PACKAGES[@]}" >/dev/null 2>&1; then
        apt-get update -qq
    fi
    # policy-rc.d 101: the packages' postinst must not try to start daemons (no systemd here);
    # we start them ourselves below with our own configuration.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e $policy ]; then
        printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && created_policy=1
    fi
    if ! apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$STATE/apt.log" 2>&1; then
        say "apt-get install failed; refreshing package lists and retrying"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$STATE/apt.log" 2>&1 \
            || { [ $created_policy = 1 ] && rm -f $policy; tail -20 "$STATE/apt.log" >&2; die "apt-get install failed"; }
    fi
    [ $created_policy = 1 ] && rm -f $policy
    say "installed"
}

# ------------------------------------------------------------------------------------------------
write_if_changed() {  # write_if_changed PATH MODE < content ; sets CHANGED=1 when the file changed
    local path=$1 mode=$2 tmp
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [ -f "$path" ] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$path"
        CHANGED=1
    fi
}

write_config() {
    mkdir -p "$CONF_DIR" "$RUN" "$LOG" "$STATE/ctld" "$STATE/d" "$STATE/gpu"
    # Fake GPUs: gres needs File= devices; plain files are enough for scheduling (slurmd logs
    # "not a valid character or block device" and registers anyway). A count-only gres line made
    # the node INVALID in our measurements.
    touch "$STATE/gpu/fakegpu0" "$STATE/gpu/fakegpu1"

    local cpus sockets cores threads mem_mb
    cpus=$(nproc --all)
    sockets=$(lscpu -p=SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l); (( sockets >= 1 )) || sockets=1
    threads=$(lscpu | awk -F: '/^Thread\(s\) per core/ {gsub(/ /, "", $2); print $2}'); threads=${threads:-1}
    cores=$(( cpus / sockets / threads )); (( cores >= 1 )) || cores=1
    mem_mb=$(awk '/^MemTotal/ {printf "%d", $2 / 1024}' /proc/meminfo)
    mem_mb=$(( mem_mb > 4096 ? mem_mb - 2048 : mem_mb * 3 / 4 ))  # below the machine's: slurmd drains otherwise

    CHANGED=0
    write_if_changed "$CONF_DIR/slurm.conf" 644 <<EOF
# Generated by deploy/slurm/cluster.sh: orch's dev cluster (several slurmd nodes on one host). See deploy/slurm/README.md.
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire+1 s before it may start again (default 120 s); the dev cluster
# shortens it so preemption tests need no admin StartTime=now. Keep the default on a real cluster.
AuthInfo=cred_expire=${ORCH_SLURM_REQUEUE_DELAY_S:-10}
StateSaveLocation=$STATE/ctld
# %n: each node's own slurmd (several run on this host, each started with -N <node>)
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
MpiDefault=none
MailProg=/bin/true
# No systemd in this container: track processes by parentage. task/cgroup puts each job in a memory
# cgroup (cgroup.conf: ConstrainRAMSpace), as real clusters do; the kernel OOM-kills a job over it.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/cgroup
ReturnToService=2
SwitchType=switch/none
InactiveLimit=0
MinJobAge=300
# TERM -> KILL wait at cancel / time limit: short, so tests end fast (the default is 30 s).
KillWait=10
# How long a silent slurmd is waited for before its node is marked DOWN (its jobs then end NODE_FAIL); Slurm's
# default, 300 s, unless ORCH_SLURM_SLURMD_TIMEOUT_S says otherwise (a node-kill test wants it short).
SlurmdTimeout=${ORCH_SLURM_SLURMD_TIMEOUT_S:-300}
Waittime=0
# Scheduling: every 2 s instead of 60 s, so a prio job preempts within seconds.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2,sched_min_interval=500000
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, a job with no --mem is given the whole node and nothing else can start.
DefMemPerCPU=1000
# Preemption: a higher PriorityTier partition preempts a lower one, per the lower one's PreemptMode.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
# Memory is enforced by the cgroup (cgroup.conf), not by the accounting poller: slurmctld refuses
# JobAcctGatherParams=OverMemoryKill together with ConstrainRAMSpace ("two incompatible memory
# enforcement mechanisms"). The poller's form (sacct FAILED 0:9 + "exceeded memory limit" in the job
# output, seen here before cgroups) is kept by tests/unit/test_slurm_states.py from its recorded output.
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
GresTypes=gpu
NodeName=$HOST CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem_mb Gres=gpu:2 State=UNKNOWN
$(extra_node_lines)
PartitionName=spot Nodes=$HOST Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_S MaxTime=INFINITE State=UP
PartitionName=spot-cancel Nodes=$HOST PriorityTier=1 PreemptMode=CANCEL GraceTime=$GRACE_S MaxTime=INFINITE State=UP
PartitionName=prio Nodes=$HOST PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
PartitionName=multi Nodes=$(nodes | paste -sd,) PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_S MaxTime=INFINITE State=UP
PartitionName=multi-prio Nodes=$(nodes | paste -sd,) PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
    # cgroup v1 (this container has it mounted at /sys/fs/cgroup, no systemd): memory only. Cores and
    # devices are not constrained (2 shared cores; fake GPU files are not devices).
    write_if_changed "$CONF_DIR/cgroup.conf" 644 <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
AllowedRAMSpace=100
ConstrainSwapSpace=no
ConstrainCores=no
ConstrainDevices=no
EOF
    write_if_changed "$CONF_DIR/gres.conf" 644 <<EOF
$(for n in $(nodes); do echo "NodeName=$n Name=gpu File=$STATE/gpu/fakegpu[0-1]"; done)
EOF
    hosts_entries
    # slurmdbd refuses a slurmdbd.conf readable by others (it holds the DB password).
    write_if_changed "$CONF_DIR/slurmdbd.conf" 600 <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=orchdev
StorageLoc=slurm_acct_db
EOF
    CONFIG_CHANGED=$CHANGED
}

extra_node_lines() {  # the fake nodes: this host's address, a port each; 2 CPUs (oversubscribed) and 2 fake GPUs
    local k
    for (( k = 2; k <= EXTRA_NODES + 1; k++ )); do
        echo "NodeName=n$k NodeHostName=$HOST NodeAddr=127.0.0.1 Port=$(( EXTRA_PORT0 + k - 2 )) CPUs=2 RealMemory=4000 Gres=gpu:2 State=UNKNOWN"
    done
}

hosts_entries() {
    # A multi-node job's rendezvous is at its first node's name (torchrun --rdzv-endpoint n2:<port>, as on a real
    # cluster): the fake nodes' names resolve to this host, on one line of /etc/hosts marked as this script's.
    local line rest
    line="127.0.0.1 $(nodes | tail -n +2 | paste -sd' ') $HOSTS_MARK"
    grep -qxF "$line" /etc/hosts 2>/dev/null && return 0
    rest=$(grep -vF "$HOSTS_MARK" /etc/hosts 2>/dev/null || true)
    # /etc/hosts may be a bind mount (containers): rewritten in place, never replaced.
    if [ "$EXTRA_NODES" -gt 0 ]; then rest+=$'\n'"$line"; fi
    printf '%s\n' "$rest" | sed '/^$/d' >"$STATE/hosts.new"
    cat "$STATE/hosts.new" >/etc/hosts
    rm -f "$STATE/hosts.new"
}

# ------------------------------------------------------------------------------------------------
start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null; then mungekey --create --force >/dev/null 2>&1; else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
        chown munge:munge /etc/munge/munge.key 2>/dev/null || true
        chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    # munged runs as the munge user the package created; as root it needs --force.
    if id munge >/dev/null 2>&1; then
        daemon su -s /bin/sh munge -c munged 2>>"$LOG/munged.start" || daemon munged --force 2>>"$LOG/munged.start"
    else
        daemon munged --force 2>>"$LOG/munged.start"
    fi
    wait_for 15 "munged up" sh -c 'munge -n | unmunge' || die "munged did not start (see $LOG/munged.start)"
}

db_ping() { mysqladmin --socket="$DB_SOCK" -uroot ping; }

start_mariadb() {
    local datadir=$STATE/mysql
    if db_ping >/dev/null 2>&1; then return 0; fi
    chown mysql:mysql "$RUN" 2>/dev/null || true
    if [ ! -d "$datadir/mysql" ]; then
        say "initialising MariaDB in $datadir"
        mkdir -p "$datadir" && chown mysql:mysql "$datadir"
        mariadb-install-db --user=mysql --datadir="$datadir" --auth-root-authentication-method=socket \
            --skip-test-db >"$LOG/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $LOG/mariadb-install.log)"
    fi
    chown mysql:mysql "$RUN"
    touch "$LOG/mariadb.log" && chown mysql:mysql "$LOG/mariadb.log"
    # Our own instance (own datadir, socket and port), so `down` never stops someone else's MariaDB.
    daemon setsid mysqld_safe --no-defaults --user=mysql --datadir="$datadir" --socket="$DB_SOCK" \
        --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$RUN/mysqld.pid" \
        --log-error="$LOG/mariadb.log" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --skip-name-resolve \
        </dev/null >/dev/null 2>&1 &
    wait_for 60 "MariaDB up" db_ping || die "MariaDB did not start (see $LOG/mariadb.log)"
    mysql --socket="$DB_SOCK" -uroot <<'EOF'
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'orchdev';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'orchdev';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
}

sacct_ok() { sacct -n -X -S now-1minutes -o JobID >/dev/null 2>&1; }
dbd_ok() { sacctmgr -n -P list cluster format=Cluster >/dev/null 2>&1; }

start_slurmdbd() {
    if [ "${CONFIG_CHANGED:-0}" = 1 ] && pid_alive "$RUN/slurmdbd.pid"; then
        stop_pidfile "$RUN/slurmdbd.pid" slurmdbd
    fi
    if ! pid_alive "$RUN/slurmdbd.pid"; then
        daemon slurmdbd || die "slurmdbd did not start (see $LOG/slurmdbd.log)"
    fi
    wait_for 60 "slurmdbd answers" dbd_ok || die "slurmdbd does not answer (see $LOG/slurmdbd.log)"
    if ! sacctmgr -n -P list cluster format=Cluster 2>/dev/null | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
        say "cluster $CLUSTER added to accounting"
    fi
}

node_state() { sinfo -h -N -n "${1:-$HOST}" -o '%T' 2>/dev/null | head -n1 || true; }
node_ready() { case "$(node_state "${1:-$HOST}")" in idle|mixed|allocated|completing) return 0;; *) return 1;; esac; }

stop_slurmds() {  # every node's slurmd, and one started before the nodes had their own pid files
    local n
    for n in $(nodes); do stop_pidfile "$RUN/slurmd-$n.pid" "slurmd $n"; done
    stop_pidfile "$RUN/slurmd.pid" slurmd
}

start_slurm() {
    if [ "${CONFIG_CHANGED:-0}" = 1 ]; then
        stop_slurmds
        pid_alive "$RUN/slurmctld.pid" && stop_pidfile "$RUN/slurmctld.pid" slurmctld
    fi
    if ! pid_alive "$RUN/slurmctld.pid"; then
        daemon slurmctld || die "slurmctld did not start (see $LOG/slurmctld.log)"
    fi
    wait_for 60 "slurmctld answers" scontrol ping || die "slurmctld does not answer (see $LOG/slurmctld.log)"
    local n
    for n in $(nodes); do
        mkdir -p "$STATE/d/$n"
        if ! pid_alive "$RUN/slurmd-$n.pid"; then
            daemon slurmd -N "$n" || die "slurmd $n did not start (see $LOG/slurmd-$n.log)"
        fi
    done
    for n in $(nodes); do
        if ! wait_for 60 "node $n ready" node_ready "$n"; then
            # A node drained by an earlier unclean stop ("Kill task failed", "Not responding") or set down by a
            # test comes back with an explicit resume.
            scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
            wait_for 30 "node $n resumed" node_ready "$n" || die "node $n is $(node_state "$n") (see $LOG/slurmd-$n.log)"
        fi
        case "$(node_state "$n")" in
            *drain*) scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true ;;
        esac
    done
    wait_for 60 "sacct answers" sacct_ok || die "sacct does not answer (see $LOG/slurmdbd.log)"
}

stop_pidfile() {  # stop_pidfile PIDFILE NAME -> TERM, then wait up to 20 s, then KILL
    local pid _
    pid_alive "$1" || return 0
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || { say "$2 stopped"; return 0; }; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
    say "$2 killed"
}

# ------------------------------------------------------------------------------------------------
cmd_up() {
    [ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts system daemons)"
    local t0=$SECONDS
    mkdir -p "$STATE" "$RUN" "$LOG"
    install_packages
    write_config
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurm
    say "up in $((SECONDS - t0)) s"
    cmd_status
}

cmd_down() {
    [ "$(id -u)" = 0 ] || die "run as root"
    stop_slurmds
    stop_pidfile "$RUN/slurmctld.pid" slurmctld
    stop_pidfile "$RUN/slurmdbd.pid" slurmdbd
    if db_ping >/dev/null 2>&1; then
        mysqladmin --socket="$DB_SOCK" -uroot shutdown && say "MariaDB stopped"
    fi
    if [ -s /run/munge/munged.pid ]; then stop_pidfile /run/munge/munged.pid munged; fi
}

cmd_status() {
    local ok=0 s
    report() { printf '  %-10s %s\n' "$1" "$2"; }
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then report munged up; else report munged DOWN; ok=1; fi
    if db_ping >/dev/null 2>&1; then report mariadb "up (port $DB_PORT)"; else report mariadb DOWN; ok=1; fi
    for d in slurmdbd slurmctld; do
        if pid_alive "$RUN/$d.pid"; then report "$d" "up (pid $(cat "$RUN/$d.pid"))"; else report "$d" DOWN; ok=1; fi
    done
    for n in $(nodes); do
        s=$(node_state "$n")
        if pid_alive "$RUN/slurmd-$n.pid"; then report "slurmd $n" "up (pid $(cat "$RUN/slurmd-$n.pid")), node ${s:-unknown}"
        else report "slurmd $n" DOWN; ok=1; fi
        node_ready "$n" || ok=1
    done
    if sacct_ok; then report sacct answers; else report sacct FAILS; ok=1; fi
    sinfo -o '  %12P %6a %10l %6D %8t %G' 2>/dev/null || true
    if [ $ok = 0 ]; then say "cluster $CLUSTER is usable"; else say "cluster $CLUSTER is NOT usable"; fi
    return $ok
}

cmd_kill() {  # kill NODE: a power loss's stand-in for one node, no signal to its jobs first (tests and benches)
    local node=${1:-} pids=() f
    [ -n "$node" ] || die "usage: $0 kill NODE"
    nodes | grep -qx -- "$node" || die "no node $node in this cluster ($(nodes | tr '\n' ' '))"
    [ -s "$RUN/slurmd-$node.pid" ] && pids+=("$(cut -d' ' -f1 "$RUN/slurmd-$node.pid")")
    # every process of the jobs' steps on it: Slurm's cgroups are named per node (slurm_<node>)
    while IFS= read -r -d '' f; do pids+=($(cat "$f")); done < <(
        find "/sys/fs/cgroup/memory/slurm_$node" -name cgroup.procs -print0 2>/dev/null)
    [ ${#pids[@]} -gt 0 ] || die "nothing of node $node to kill"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    say "killed node $node: ${#pids[@]} process(es); \`$0 up\` brings it back"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kill) shift; cmd_kill "$@" ;;
    *) echo "usage: $0 {up|down|status|kill NODE}" >&2; exit 2 ;;
esac
