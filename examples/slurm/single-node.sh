#!/usr/bin/env bash
# A single-node SLURM with accounting on this machine, to try euclip's cluster path (`euclip study
# --launcher slurm`, examples/slurm/euclip-train.sbatch) without a cluster. CI starts it for the tests
# marked `slurm` (tests/test_slurm.py) and stops it afterwards.
#
#   examples/slurm/single-node.sh start    # as root; prints the partition once the node is idle
#   examples/slurm/single-node.sh stop     # cancels every job and stops the daemons
#
# Needs Debian's packages (as root: apt-get install slurmctld slurmd slurm-client munge slurmdbd
# mariadb-server) and no systemd: every daemon is started here directly. submitit follows jobs with
# `sacct`, which needs slurmdbd on MariaDB, hence the database. Without cgroups, processes are
# tracked by their parent (proctrack/linuxproc) and not confined (task/none). The node offers this
# machine's cores and its memory less 1 GiB. Everything lives under $EUCLIP_SLURM_DIR
# (/var/lib/euclip-slurm): configuration, state, logs; a start after a stop reuses it.
set -euo pipefail

dir=${EUCLIP_SLURM_DIR:-/var/lib/euclip-slurm}
conf=/etc/slurm
host=$(hostname -s)
cluster=euclip
password=euclip-single-node  # the database listens on its socket only

say() { echo "single-node SLURM: $*"; }

wait_for() {  # $1 seconds, $2 what, rest: the command that must succeed
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq "$((seconds * 4))"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    say "$what did not come up within ${seconds} s (logs: $dir/log)" >&2
    return 1
}

stop() {
    scancel --user=root --full 2>/dev/null || true
    for daemon in slurmd slurmctld slurmdbd; do
        pkill -x "$daemon" 2>/dev/null || true
    done
    wait_for 30 "the SLURM daemons' exit" bash -c '! pgrep -x "slurmd|slurmctld|slurmdbd"' || true
    [ -f /run/mysqld/mariadb.pid ] && kill "$(cat /run/mysqld/mariadb.pid)" 2>/dev/null || true
    pkill -x munged 2>/dev/null || true
    # Gone before this returns: a start right after would otherwise find a daemon on its way out.
    wait_for 60 "MariaDB's and munge's exit" bash -c '! pgrep -x "mariadbd|munged"' || true
    say "stopped"
}

start() {
    [ "$(id -u)" = 0 ] || { say "start it as root (it runs the daemons)" >&2; exit 2; }
    for tool in slurmctld slurmd slurmdbd munged mariadbd sacctmgr; do
        command -v "$tool" >/dev/null || {
            say "$tool is missing: apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server" >&2
            exit 2
        }
    done
    getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >> /etc/hosts  # slurmd looks its node up
    mkdir -p "$dir"/{log,state,spool,db,run}
    chown slurm:slurm "$dir"/{log,state,spool}

    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge
    pgrep -x munged >/dev/null || runuser -u munge -- munged
    wait_for 10 munge munge -n

    if [ ! -d "$dir/db/mysql" ]; then
        mariadb-install-db --user=mysql --datadir="$dir/db" --auth-root-authentication-method=socket >"$dir/log/db-install.log"
    fi
    chown -R mysql:mysql "$dir/db"
    if ! mariadb -e 'select 1' >/dev/null 2>&1; then
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld  # its default socket: slurmdbd finds it there
        rm -f /run/mysqld/mysqld.sock  # a stale socket of a server that is gone (none answered)
        mariadbd --user=mysql --datadir="$dir/db" --socket=/run/mysqld/mysqld.sock --skip-networking \
            --pid-file=/run/mysqld/mariadb.pid --log-error="$dir/db/mariadb.log" 2>>"$dir/db/mariadb.log" &
        wait_for 60 MariaDB mariadb -e 'select 1'
    fi
    mariadb -e "create user if not exists 'slurm'@'localhost' identified by '$password';
        grant all on slurm_acct_db.* to 'slurm'@'localhost';"

    cat > "$conf/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=0
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$password
LogFile=$dir/log/slurmdbd.log
PidFile=$dir/run/slurmdbd.pid
EOF
    # MariaDB on its default socket, no network: slurmdbd reaches it through StorageHost=localhost.
    chown slurm:slurm "$conf/slurmdbd.conf" && chmod 600 "$conf/slurmdbd.conf"
    cpus=$(nproc)
    memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat > "$conf/slurm.conf" <<EOF
ClusterName=$cluster
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    chown slurm:slurm "$dir/run"
    pgrep -x slurmdbd >/dev/null || slurmdbd
    wait_for 60 slurmdbd sacctmgr -n list cluster
    sacctmgr -i add cluster "$cluster" >/dev/null 2>&1 || true
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    wait_for 60 "the node" bash -c 'sinfo -h -o %T | grep -Eq "^(idle|mixed|allocated)"'
    say "up: $(sinfo -h -o '%P %D %c %m %T')"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
