#!/usr/bin/env bash
# A single-node Slurm on this machine, for the Slurm tests (tests/test_slurm.py) and for
# trying `snakemake --profile slurm` without a cluster.
#
#   sudo scripts/local-slurm.sh start [--with-dbd]   install (Debian packages) if missing, configure, start
#   sudo scripts/local-slurm.sh stop                 stop what `start` started (by PID file only)
#   scripts/local-slurm.sh status                    daemons and node state
#
# Root only (it installs packages, writes /etc/slurm and runs the daemons as root/slurm/munge),
# no systemd needed. Everything listens on 127.0.0.1 only. The one node is called "localhost"
# (slurmd -N localhost, whatever the hostname), has nproc CPUs, 80 % of the memory and fake
# GPUs (Gres=gpu:2 backed by /dev/null and /dev/zero; gpu:1 on a 1-CPU machine) so that
# `--gpus=1` jobs are accepted and two training jobs can run at once.
# --with-dbd adds MariaDB + slurmdbd so that `sacct` works (accounting). Running `start`
# again is a no-op for daemons already running; `start --with-dbd` after a plain `start`
# restarts slurmctld with the accounting configuration.
set -euo pipefail

CLUSTER=localcluster
ETC=/etc/slurm
RUN=/run/slurm
LOGDIR=/var/log/slurm
STATE=/var/lib/fnl-local-slurm          # our bookkeeping: which daemons this script started
DB_PASS=slurmpw                         # local-only database, reachable from 127.0.0.1 only

die() { echo "local-slurm: $*" >&2; exit 1; }
say() { echo "local-slurm: $*"; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it installs Debian packages and starts the Slurm daemons); try: sudo $0 $*"
}

alive() {  # alive PIDFILE: the process named in PIDFILE runs
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local secs=$1 what=$2; shift 2
    local i
    for ((i = 0; i < secs * 5; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    die "timed out after ${secs}s waiting for $what (logs in $LOGDIR)"
}

install_packages() {
    local with_dbd=$1 pkgs=() missing=()
    pkgs=(munge slurmctld slurmd slurm-client)
    [ "$with_dbd" = 1 ] && pkgs+=(slurmdbd mariadb-server)
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "packages ${missing[*]} are missing and apt-get is not available; install Slurm (slurmctld, slurmd, slurm-client, munge and, for --with-dbd, slurmdbd and mariadb-server) by other means"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed (no network or no package index?)"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

write_slurm_conf() {
    local with_dbd=$1 cpus mem acct gpus
    cpus=$(nproc)
    gpus=$((cpus >= 2 ? 2 : 1))   # fake GPUs, one device file each (/dev/null, /dev/zero)
    mem=$(free -m | awk '/^Mem:/ {print int($2 * 0.8)}')   # leave room for the OS
    if [ "$with_dbd" = 1 ]; then
        acct="JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu"
    else
        acct="JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none"
    fi
    mkdir -p "$ETC"
    cat >"$ETC/slurm.conf.new" <<EOF
# Written by scripts/local-slurm.sh (FNL-Repro): a single-node test cluster on 127.0.0.1.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
# Start a submitted batch job at the next pass of slurmctld's background loop (about 1 s)
# instead of waiting up to batch_sched_delay's default 3 s: a workflow is a chain of short
# jobs, each submitted only when the one before it has ended.
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
$acct
JobCompType=jobcomp/none
# squeue must still see finished jobs when Snakemake polls with squeue (>= 120 s)
MinJobAge=600
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # A fake GPU: slurmd needs a device file to count it (without File= it reports 0 and drains).
    {
        echo "NodeName=localhost Name=gpu File=/dev/null"
        if [ "$gpus" = 2 ]; then echo "NodeName=localhost Name=gpu File=/dev/zero"; fi
    } >"$ETC/gres.conf"
    if cmp -s "$ETC/slurm.conf.new" "$ETC/slurm.conf"; then
        rm -f "$ETC/slurm.conf.new"; return 1    # unchanged
    fi
    mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"; return 0
}

mark() { mkdir -p "$STATE"; echo "$2" >"$STATE/$1"; }   # remember the PID file of a daemon we started

start_munge() {
    mkdir -p /run/munge; chown munge:munge /run/munge; chmod 755 /run/munge
    alive /run/munge/munged.pid && return 0
    [ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing; reinstall munge (apt-get install --reinstall munge) or create it with mungekey"
    runuser -u munge -- /usr/sbin/munged
    mark munged /run/munge/munged.pid
    wait_for 10 "munged" bash -c 'munge -n | unmunge'
}

start_dbd() {
    mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
    if ! alive /run/mysqld/mysqld.pid; then
        [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >"$LOGDIR/mariadb-install.log" 2>&1
        /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --pid-file=/run/mysqld/mysqld.pid \
            >"$LOGDIR/mariadb.log" 2>&1 &
        mark mariadbd /run/mysqld/mysqld.pid
        wait_for 30 "MariaDB" test -S /run/mysqld/mysqld.sock
        wait_for 30 "MariaDB" mariadb -e "SELECT 1"
    fi
    mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
                CREATE DATABASE IF NOT EXISTS slurm_acct_db;
                GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
LogFile=$LOGDIR/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$DB_PASS
EOF
    install -o slurm -g slurm -m 600 "$tmp" "$ETC/slurmdbd.conf"; rm -f "$tmp"
    if ! alive "$RUN/slurmdbd.pid"; then
        slurmdbd
        mark slurmdbd "$RUN/slurmdbd.pid"
    fi
    wait_for 30 "slurmdbd" sacctmgr -n list cluster
    sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

node_idle() { sinfo -h -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; }

cmd_start() {
    local with_dbd=0
    for a in "$@"; do
        case $a in
            --with-dbd) with_dbd=1 ;;
            *) die "unknown option '$a' (usage: $0 start [--with-dbd])" ;;
        esac
    done
    need_root start "$@"
    install_packages "$with_dbd"
    mkdir -p /var/spool/slurmctld /var/spool/slurmd "$LOGDIR" "$RUN"
    chown slurm:slurm /var/spool/slurmctld "$LOGDIR" "$RUN"
    local changed=0
    write_slurm_conf "$with_dbd" && changed=1
    start_munge
    [ "$with_dbd" = 1 ] && start_dbd
    if [ "$changed" = 1 ] && alive "$RUN/slurmctld.pid"; then
        say "configuration changed: restarting slurmctld and slurmd"
        local d pid
        for d in slurmd slurmctld; do
            alive "$RUN/$d.pid" || continue
            pid=$(cat "$RUN/$d.pid")
            kill "$pid"
            wait_for 30 "$d to stop" bash -c "! kill -0 $pid"
        done
    fi
    if ! alive "$RUN/slurmctld.pid"; then
        slurmctld
        mark slurmctld "$RUN/slurmctld.pid"
    fi
    wait_for 30 "slurmctld" scontrol ping
    if ! alive "$RUN/slurmd.pid"; then
        slurmd -N localhost          # the node is "localhost" whatever this machine's hostname
        mark slurmd "$RUN/slurmd.pid"
    fi
    # A node drained by an earlier bad configuration would never go idle on its own.
    if sinfo -h -o %t 2>/dev/null | grep -Eq 'drain|inval|down'; then
        scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
    fi
    wait_for 60 "node localhost to become idle (sinfo)" node_idle
    say "running: $(sinfo -h -o '%P %D %t %G') $([ "$with_dbd" = 1 ] && echo '(accounting: sacct works)')"
}

cmd_stop() {
    need_root stop
    [ -d "$STATE" ] || { say "nothing started by this script"; return 0; }
    local d pidfile pid
    for d in slurmd slurmctld slurmdbd mariadbd munged; do     # reverse start order
        [ -s "$STATE/$d" ] || continue
        pidfile=$(cat "$STATE/$d")
        if alive "$pidfile"; then
            pid=$(cat "$pidfile")
            kill "$pid"
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            say "stopped $d ($pid)"
        fi
        rm -f "$STATE/$d"
    done
}

cmd_status() {
    local d f
    for d in munged:/run/munge/munged.pid mariadbd:/run/mysqld/mysqld.pid slurmdbd:$RUN/slurmdbd.pid \
             slurmctld:$RUN/slurmctld.pid slurmd:$RUN/slurmd.pid; do
        f=${d#*:}
        if alive "$f"; then echo "${d%%:*}: running ($(cat "$f"))"; else echo "${d%%:*}: not running"; fi
    done
    command -v sinfo >/dev/null && sinfo 2>/dev/null || true
    alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid"
}

case ${1:-} in
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) die "usage: $0 start [--with-dbd] | stop | status" ;;
esac
