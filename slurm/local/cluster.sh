#!/usr/bin/env bash
# A real single-node SLURM cluster with accounting on 127.0.0.1, for tests and local runs.
#
#   slurm/local/cluster.sh up          install what is missing, start what is stopped, wait for a job to run
#   slurm/local/cluster.sh down        cancel jobs, stop every daemon this script started (by PID)
#   slurm/local/cluster.sh status      one line per daemon; exit 0 when up, 3 when down, 4 when partial
#   slurm/local/cluster.sh status --json
#   slurm/local/cluster.sh purge       down, then delete the state folder and the config files written here
#
# Stack: munged, MariaDB (private datadir), slurmdbd, slurmctld, slurmd; no systemd. Debian packages
# (lean set) are installed when missing. Everything it keeps lives under the state folder
# ($AGENTLOAD_SLURM_STATE, default /var/lib/agentload-slurm); the only files outside it are
# /etc/slurm/slurm.conf, /etc/slurm/slurmdbd.conf and /etc/slurm/gres.conf (where the Slurm daemons and
# commands look for them), each marked as written here. A slurm.conf without that mark is never overwritten.
#
# The node has AGENTLOAD_SLURM_GPUS (default 2) GPUs that are no devices (GresTypes=gpu, Gres=gpu:N, a
# gres.conf with AutoDetect=off whose File= names placeholder nodes under the state folder, each the
# null device), so jobs can ask `--gres gpu:1` and the scheduler allocates, accounts and refuses GPUs as
# a GPU cluster does, and sets SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES to the indices it gave. Slurm
# 22.05 cannot count GPUs without File=: gres.c drops "file-less GPU"s from the node's list and the node
# then registers INVAL ("gres/gpu count reported lower than configured"), CountOnly included.
#
# `up` is idempotent (a second call only checks) and recovers after a crash: a daemon whose PID file
# is stale (dead, a zombie, or a PID reused by another program) is started again. Job IDs keep
# increasing across down/up because the controller state and the database are kept; `purge` resets them.
#
# Environment: AGENTLOAD_SLURM_STATE (state folder), AGENTLOAD_SLURM_CLUSTER (cluster name, agentload),
# AGENTLOAD_SLURM_ACCOUNT (account, agentload), AGENTLOAD_SLURM_USERS (users to register; default the
# calling user), AGENTLOAD_SLURM_DB_PORT (MariaDB TCP port on 127.0.0.1, 3306), AGENTLOAD_SLURM_GPUS
# (the node's GPUs, placeholder nodes, no devices: 2; 0 configures none).
set -euo pipefail

P=${AGENTLOAD_SLURM_STATE:-/var/lib/agentload-slurm}
P=${P%/}
CLUSTER=${AGENTLOAD_SLURM_CLUSTER:-agentload}
ACCOUNT=${AGENTLOAD_SLURM_ACCOUNT:-agentload}
PARTITION=debug
DB_PORT=${AGENTLOAD_SLURM_DB_PORT:-3306}
GPUS=${AGENTLOAD_SLURM_GPUS:-2}
[[ $GPUS =~ ^[0-9]+$ ]] || { echo "AGENTLOAD_SLURM_GPUS=$GPUS: expected a whole number of GPUs" >&2; exit 2; }
CONF_DIR=/etc/slurm
SLURM_CONF_FILE=$CONF_DIR/slurm.conf
DBD_CONF_FILE=$CONF_DIR/slurmdbd.conf
GRES_CONF_FILE=$CONF_DIR/gres.conf
MARK="# Written by agentload slurm/local/cluster.sh"
MYCNF=$P/etc/my.cnf
DB_SOCKET=$P/run/mysql/mysqld.sock
PROBE_TIMEOUT_S=120
# Debian packages (bookworm): the lean set. Each entry: a file it provides, the package.
PACKAGES=(
  /usr/sbin/munged:munge
  /usr/bin/munge:munge
  /usr/sbin/mariadbd:mariadb-server-core
  /usr/bin/mariadb-install-db:mariadb-server-core
  /usr/bin/mariadb:mariadb-client-core
  /usr/sbin/slurmdbd:slurmdbd
  /usr/sbin/slurmctld:slurmctld
  /usr/sbin/slurmd:slurmd
  /usr/bin/sbatch:slurm-client
  /usr/bin/sacctmgr:slurm-client
)
# Daemons in start order; each name is also the /proc comm of the running program (see pidfile_of).
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

T0_US=${EPOCHREALTIME/./}
say() {
  local us=$((${EPOCHREALTIME/./} - T0_US))
  printf '[agentload-slurm %3d.%02ds] %s\n' $((us / 1000000)) $((us % 1000000 / 10000)) "$*"
}
die() { say "ERROR: $*" >&2; exit 1; }

pidfile_of() {
  case $1 in
    munged) echo "$P/run/munged.pid" ;;       # written here only when this script started munged
    mariadbd) echo "$P/run/mariadbd.pid" ;;   # $! of the mariadbd started here (it writes its own in run/mysql)
    slurmdbd) echo "$P/run/slurm/slurmdbd.pid" ;;
    slurmctld) echo "$P/run/slurm/slurmctld.pid" ;;
    slurmd) echo "$P/run/slurmd.pid" ;;
  esac
}

# A process is running when /proc/PID exists, is not a zombie (PID 1 here does not reap, so a stopped
# daemon lingers as State: Z and `kill -0` still succeeds) and runs the expected program.
pid_running() { # pid comm
  local pid=$1 comm=$2 state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/status ]] || return 1
  state=$(awk '/^State:/{print $2; exit}' "/proc/$pid/status" 2>/dev/null) || return 1
  [[ $state != Z && $state != X && -n $state ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]]
}

daemon_pid() { # name -> prints the PID from our PID file when that daemon is running
  local f pid
  f=$(pidfile_of "$1")
  [[ -s $f ]] || return 1
  pid=$(head -n1 "$f" | tr -dc 0-9)
  pid_running "$pid" "$1" || return 1
  echo "$pid"
}

munge_works() { command -v munge >/dev/null && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

need_root() { [[ $(id -u) == 0 ]] || die "must run as root to $* (packages, daemons and /etc/slurm are system-wide)"; }

# ---------------------------------------------------------------- install
install_packages() {
  local missing=() entry file pkg
  for entry in "${PACKAGES[@]}"; do
    file=${entry%%:*}; pkg=${entry#*:}
    [[ -x $file ]] || missing+=("$pkg")
  done
  # slurmdbd needs the MySQL storage plugin (a dependency of the Debian slurmdbd package).
  if ! compgen -G "/usr/lib/*/slurm-wlm/accounting_storage_mysql.so" >/dev/null; then missing+=(slurm-wlm-mysql-plugin); fi
  ((${#missing[@]})) || return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  need_root "install ${missing[*]}"
  say "installing Debian packages: ${missing[*]}"
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # Keep the packages' maintainer scripts from starting services (there is no systemd here).
    # Removed again after the install, also when this script is interrupted.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  local rc=0
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -q >"$P/log/apt.log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        mariadb-server-core mariadb-client-core slurmdbd slurmctld slurmd slurm-client munge \
        >>"$P/log/apt.log" 2>&1
  } || rc=$?
  if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
  ((rc == 0)) || { tail -n 20 "$P/log/apt.log" >&2; die "apt-get failed (rc $rc); full log: $P/log/apt.log"; }
  say "packages installed"
}

ensure_users() {
  if ! getent passwd mysql >/dev/null; then
    say "creating system user mysql"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mysql
  fi
  getent passwd slurm >/dev/null || die "user slurm is missing (the slurm packages create it)"
  getent passwd munge >/dev/null || die "user munge is missing (the munge package creates it)"
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    install -d -o munge -g munge -m 700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
}

make_dirs() {
  install -d -m 755 "$P" "$P/etc" "$P/run" "$P/log" "$P/state" "$P/state/d"
  install -d -o mysql -g mysql -m 755 "$P/run/mysql"
  install -d -o slurm -g slurm -m 755 "$P/run/slurm"
  install -d -o slurm -g slurm -m 700 "$P/state/ctld"
  local f
  for f in mariadb.err; do [[ -e $P/log/$f ]] || install -o mysql -g mysql -m 640 /dev/null "$P/log/$f"; done
  for f in slurmdbd.log slurmctld.log; do [[ -e $P/log/$f ]] || install -o slurm -g slurm -m 640 /dev/null "$P/log/$f"; done
  if [[ ! -s $P/etc/db.secret ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$P/etc/db.secret")
  fi
}

# ---------------------------------------------------------------- configuration
node_line() {
  local line
  line=$(slurmd -C 2>/dev/null | head -n1) || true
  [[ $line == NodeName=* ]] || die "slurmd -C printed no NodeName line"
  if ((GPUS > 0)); then line="$line Gres=gpu:$GPUS"; fi
  echo "$line NodeAddr=127.0.0.1 State=UNKNOWN"
}

render_my_cnf() {
  cat <<EOF
$MARK
[mysqld]
user=mysql
datadir=$P/db
socket=$DB_SOCKET
pid-file=$P/run/mysql/mariadbd.pid
log-error=$P/log/mariadb.err
bind-address=127.0.0.1
port=$DB_PORT
innodb_buffer_pool_size=1024M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
skip-name-resolve
[client]
socket=$DB_SOCKET
port=$DB_PORT
EOF
}

render_slurm_conf() {
  local host
  host=$(hostname -s)
  cat <<EOF
$MARK
# state: $P
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# Short credential lifetime: a requeued job waits this long instead of 120 s.
AuthInfo=cred_expire=10
StateSaveLocation=$P/state/ctld
SlurmdSpoolDir=$P/state/d
SlurmctldPidFile=$P/run/slurm/slurmctld.pid
SlurmdPidFile=$P/run/slurmd.pid
SlurmctldLogFile=$P/log/slurmctld.log
SlurmdLogFile=$P/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups in this container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Short scheduler intervals so tests are fast.
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5
ReturnToService=2
DependencyParameters=kill_invalid_depend
MinJobAge=300
KillWait=5
InactiveLimit=0
# Accounting through slurmdbd: sacct has every job; job comments and batch scripts are stored.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStoreFlags=job_comment,job_script
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
# GPUs that are no devices (gres.conf: placeholder File= nodes, no autodetection; see render_gres_conf).
GresTypes=gpu
$(node_line)
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

gpu_files() { # the File= value of the node's GPUs: placeholder nodes gpu0..gpu(N-1) under the state folder
  if ((GPUS == 1)); then echo "$P/gpu/gpu0"; else echo "$P/gpu/gpu[0-$((GPUS - 1))]"; fi
}

render_gres_conf() {
  # No NVML autodetection, and File= placeholders: Slurm 22.05 keeps no GPU without a File (gres.c
  # "Removing file-less GPU ... from final GRES list", gres_gpu.c "Discarding the following config-only
  # GPU due to lack of File specification"; gres.conf(5): File is required for GPUs), CountOnly or not.
  # The placeholders are character nodes of the null device (make_gpu_nodes): nothing opens them; the
  # scheduler only hands out their indices.
  cat <<EOF
$MARK
# state: $P
AutoDetect=off
EOF
  if ((GPUS > 0)); then echo "NodeName=$(hostname -s) Name=gpu Count=$GPUS File=$(gpu_files)"; fi
}

make_gpu_nodes() { # $P/gpu/gpu0..gpu(N-1): each a character node of the null device (1:3)
  install -d -m 755 "$P/gpu"
  local i f
  for ((i = 0; i < GPUS; i++)); do
    f=$P/gpu/gpu$i
    [[ -c $f ]] && continue
    rm -f "$f"
    mknod -m 666 "$f" c 1 3 2>/dev/null || die "cannot create the placeholder GPU node $f (mknod c 1 3 needs root and CAP_MKNOD)"
  done
}

render_dbd_conf() {
  cat <<EOF
$MARK
# state: $P
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
PidFile=$P/run/slurm/slurmdbd.pid
LogFile=$P/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$P/etc/db.secret")
StorageLoc=slurm_acct_db
EOF
}

CONF_CHANGED=0
# install_conf FILE OWNER MODE < content: writes only when the content differs; sets CONF_CHANGED
# (so it must run in this shell: feed it with < <(...), not through a pipe).
install_conf() {
  local file=$1 owner=$2 mode=$3 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [[ -e $file ]] && ! grep -qxF "$MARK" "$file"; then
    rm -f "$tmp"
    die "$file exists and was not written by this script; move it away to use the local cluster"
  fi
  if [[ -e $file ]] && cmp -s "$tmp" "$file"; then rm -f "$tmp"; return 0; fi
  install -o "$owner" -m "$mode" "$tmp" "$file"
  rm -f "$tmp"
  CONF_CHANGED=1
  say "wrote $file"
}

other_cluster_running() { # another state folder's cluster owns /etc/slurm right now
  local other pidf pid comm
  [[ -r $SLURM_CONF_FILE ]] || return 1
  other=$(sed -n 's/^# state: //p' "$SLURM_CONF_FILE" | head -n1)
  [[ -n $other && $other != "$P" ]] || return 1
  for pidf in "$other/run/slurm/slurmctld.pid:slurmctld" "$other/run/slurmd.pid:slurmd" "$other/run/slurm/slurmdbd.pid:slurmdbd"; do
    comm=${pidf##*:}; pidf=${pidf%:*}
    pid=$(head -n1 "$pidf" 2>/dev/null | tr -dc 0-9) || true
    if pid_running "$pid" "$comm"; then echo "$other"; return 0; fi
  done
  return 1
}

MYCNF_CHANGED=0
write_configs() {
  install -d -m 755 "$CONF_DIR"
  install_conf "$MYCNF" root 644 < <(render_my_cnf)
  MYCNF_CHANGED=$CONF_CHANGED
  CONF_CHANGED=0
  install_conf "$SLURM_CONF_FILE" root 644 < <(render_slurm_conf)
  install_conf "$DBD_CONF_FILE" slurm 600 < <(render_dbd_conf)
  install_conf "$GRES_CONF_FILE" root 644 < <(render_gres_conf)
}

# ---------------------------------------------------------------- daemons
wait_for() { # seconds description command...
  local limit=$1
  shift 2
  local end=$(($(date +%s) + limit))
  local rc
  while :; do
    rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    ((rc == 0)) && return 0
    ((rc == 99)) && return 1
    (($(date +%s) < end)) || return 1
    sleep 0.1
  done
}

db_ping() { mariadb --defaults-file="$MYCNF" -uroot -e 'select 1'; }

mariadb_up() { # stops waiting (returns 99) when mariadbd has exited
  daemon_pid mariadbd >/dev/null || return 99
  db_ping
}

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

start_munged() {
  if munge_works; then return 0; fi
  say "starting munged"
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force </dev/null >>"$P/log/munged.out" 2>&1 9>&- || die "munged failed to start (see $P/log/munged.out, /var/log/munge/munged.log)"
  wait_for 10 munge munge_works || die "munged started but munge -n | unmunge fails"
  local pid
  pid=$(head -n1 /run/munge/munged.pid 2>/dev/null | tr -dc 0-9)
  pid_running "$pid" munged || die "munged is running but /run/munge/munged.pid has no live PID"
  echo "$pid" >"$P/run/munged.pid"
}

start_mariadb() {
  if daemon_pid mariadbd >/dev/null; then
    ((MYCNF_CHANGED)) || return 0
    say "my.cnf changed: restarting mariadbd"
    stop_daemon slurmdbd
    stop_daemon mariadbd
  fi
  port_busy "$DB_PORT" && die "port $DB_PORT is taken by another program (set AGENTLOAD_SLURM_DB_PORT)"
  local fresh=0
  if [[ ! -d $P/db/mysql ]]; then
    say "initialising the MariaDB datadir $P/db"
    rm -rf "$P/db"
    mariadb-install-db --defaults-file="$MYCNF" --user=mysql --datadir="$P/db" --skip-test-db \
      --auth-root-authentication-method=socket >"$P/log/mariadb-install-db.log" 2>&1 ||
      { tail -n 20 "$P/log/mariadb-install-db.log" >&2; die "mariadb-install-db failed"; }
    fresh=1
  fi
  say "starting mariadbd"
  rm -f "$DB_SOCKET" "$P/run/mysql/mariadbd.pid"
  chown mysql:mysql "$P/run/mysql"
  setsid /usr/sbin/mariadbd --defaults-file="$MYCNF" </dev/null >>"$P/log/mariadbd.out" 2>&1 9>&- &
  echo $! >"$(pidfile_of mariadbd)"
  if ! wait_for 60 mariadb mariadb_up; then
    tail -n 20 "$P/log/mariadb.err" >&2
    die "mariadbd did not answer (log: $P/log/mariadb.err)"
  fi
  local pw
  pw=$(cat "$P/etc/db.secret")
  mariadb --defaults-file="$MYCNF" -uroot <<EOF || die "could not create the accounting database and user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
  ((fresh)) && say "accounting database created"
  return 0
}

stop_daemon() { # name: TERM, wait (a zombie counts as stopped), then KILL
  local name=$1 pid f
  f=$(pidfile_of "$name")
  if pid=$(daemon_pid "$name"); then
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local end=$(($(date +%s) + 30))
    while pid_running "$pid" "$name"; do
      if (($(date +%s) >= end)); then
        say "$name did not stop in 30 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
        break
      fi
      sleep 0.1
    done
  fi
  rm -f "$f"
}

start_slurm_daemon() { # name
  local name=$1
  if daemon_pid "$name" >/dev/null; then
    if ((CONF_CHANGED)); then
      say "configuration changed: restarting $name"
      stop_daemon "$name"
    else
      return 0
    fi
  fi
  case $name in
    slurmdbd) port_busy 6819 && die "port 6819 is taken by another program" ;;
    slurmctld) port_busy 6817 && die "port 6817 is taken by another program" ;;
    slurmd) port_busy 6818 && die "port 6818 is taken by another program" ;;
  esac
  say "starting $name"
  rm -f "$(pidfile_of "$name")"
  "/usr/sbin/$name" </dev/null >>"$P/log/$name.out" 2>&1 9>&- || { tail -n 20 "$P/log/$name.log" >&2 || true; die "$name failed to start"; }
  if ! wait_for 15 "$name pid" daemon_pid "$name"; then
    tail -n 20 "$P/log/$name.log" >&2 || true
    die "$name exited after starting (log: $P/log/$name.log)"
  fi
}

dbd_answers() { sacctmgr -n -P show cluster format=cluster; }

ctld_answers() { scontrol ping | grep -q 'is UP'; }

# sinfo's state with the power/reservation flags removed; a trailing * (not responding) is kept.
node_state() { sinfo -h -N -o '%T' 2>/dev/null | head -n1 | tr -d '~#%$@^'; }

node_ready() { [[ $(node_state) =~ ^(idle|mixed|allocated|completing)$ ]]; }

cluster_registered() { dbd_answers 2>/dev/null | grep -qxF "$CLUSTER"; }

register_cluster() {
  # slurmctld registers its cluster in slurmdbd on its first start; add it only if that did not happen.
  wait_for 10 cluster cluster_registered && return 0
  say "registering cluster $CLUSTER"
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

register_users() {
  local users=${AGENTLOAD_SLURM_USERS:-${SUDO_USER:-$(id -un)}} assoc u
  assoc=$(sacctmgr -n -P show assoc cluster="$CLUSTER" format=account,user)
  if ! grep -q "^$ACCOUNT|$" <<<"$assoc"; then
    say "adding account $ACCOUNT"
    sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=agentload Organization=agentload >/dev/null
  fi
  for u in ${users//,/ }; do
    if ! grep -qxF "$ACCOUNT|$u" <<<"$assoc"; then
      say "adding user $u to account $ACCOUNT"
      sacctmgr -i add user "$u" Cluster="$CLUSTER" Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null
    fi
  done
}

probe_job() {
  say "probe: srun -N1 -n1 -t 1 true"
  local out
  if ! out=$(timeout "$PROBE_TIMEOUT_S" srun -N1 -n1 -t 1 -J agentload-probe true 2>&1); then
    echo "$out" >&2
    die "the probe job did not run within ${PROBE_TIMEOUT_S} s (logs: $P/log/slurmctld.log, $P/log/slurmd.log)"
  fi
}

all_running() {
  local d
  munge_works || return 1
  for d in mariadbd slurmdbd slurmctld slurmd; do daemon_pid "$d" >/dev/null || return 1; done
}

conf_current() { # every config file matches what would be written now
  [[ -e $P/etc/db.secret && -e $SLURM_CONF_FILE && -e $DBD_CONF_FILE && -e $GRES_CONF_FILE && -e $MYCNF ]] || return 1
  cmp -s <(render_slurm_conf) "$SLURM_CONF_FILE" && cmp -s <(render_my_cnf) "$MYCNF" && cmp -s <(render_gres_conf) "$GRES_CONF_FILE" || return 1
  # slurmdbd.conf and the DB secret are readable by root only; another user cannot compare them.
  [[ -r $DBD_CONF_FILE && -r $P/etc/db.secret ]] || return 0
  cmp -s <(render_dbd_conf) "$DBD_CONF_FILE"
}

take_lock() {
  # Serialise concurrent calls. Every daemon is started with fd 9 closed, or it would hold the lock.
  install -d -m 755 "$P" "$P/log"
  exec 9>"$P/.lock"
  flock -w 300 9 || die "another cluster.sh holds $P/.lock for 300 s"
}

cmd_up() {
  if all_running && conf_current && ctld_answers 2>/dev/null && node_ready; then
    say "already up (state $P, cluster $CLUSTER, partition $PARTITION, node $(node_state))"
    return 0
  fi
  need_root "up"
  local other
  if other=$(other_cluster_running); then
    die "the cluster of state folder $other is running; stop it first: AGENTLOAD_SLURM_STATE=$other $0 down"
  fi
  take_lock
  install_packages
  ensure_users
  make_dirs
  make_gpu_nodes
  write_configs
  start_munged
  start_mariadb
  start_slurm_daemon slurmdbd
  wait_for 30 slurmdbd dbd_answers || die "slurmdbd does not answer sacctmgr (log: $P/log/slurmdbd.log)"
  start_slurm_daemon slurmctld
  wait_for 30 slurmctld ctld_answers || die "slurmctld does not answer scontrol ping (log: $P/log/slurmctld.log)"
  register_cluster
  start_slurm_daemon slurmd
  if ! wait_for 30 node node_ready; then
    say "node is $(node_state); resuming it"
    scontrol update NodeName="$(hostname -s)" State=RESUME >/dev/null 2>&1 || true
    wait_for 30 node node_ready || die "node is $(node_state) (log: $P/log/slurmd.log)"
  fi
  register_users
  probe_job
  say "up (state $P, cluster $CLUSTER, account $ACCOUNT, partition $PARTITION)"
}

no_running_jobs() { [[ -z $(squeue -h -t running,completing -o %A 2>/dev/null) ]]; }

cancel_jobs() { # pending jobs too: they would otherwise start at the next `up`
  ctld_answers 2>/dev/null || return 0
  local ids
  mapfile -t ids < <(squeue -h -o %A 2>/dev/null | sort -u)
  ((${#ids[@]})) || return 0
  say "cancelling ${#ids[@]} job(s): ${ids[*]}"
  scancel "${ids[@]}" 2>/dev/null || true
  wait_for 30 jobs no_running_jobs || say "some jobs are still completing"
}

kill_steps() { # job steps left behind by our slurmd (slurmstepd keeps running when slurmd stops)
  local f c pid
  for f in /proc/[0-9]*/comm; do
    read -r c <"$f" 2>/dev/null || continue
    [[ $c == slurmstepd ]] || continue
    pid=${f#/proc/}; pid=${pid%/comm}
    if pid_running "$pid" slurmstepd; then
      say "stopping leftover slurmstepd (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
}

cmd_down() {
  local any=0 d
  for d in "${DAEMONS[@]}"; do daemon_pid "$d" >/dev/null && any=1; done
  if ((!any)); then say "already down"; return 0; fi
  need_root "down"
  take_lock
  cancel_jobs
  for d in slurmd slurmctld slurmdbd mariadbd munged; do stop_daemon "$d"; done
  kill_steps
  say "down"
}

cmd_status() {
  local json=0 d pid running n_up=0 n=0 items=() ns=""
  [[ ${1:-} == --json ]] && json=1
  for d in "${DAEMONS[@]}"; do
    n=$((n + 1))
    if pid=$(daemon_pid "$d"); then running=true; n_up=$((n_up + 1)); else pid=""; running=false; fi
    if [[ $d == munged && $running == false ]] && munge_works; then
      # munged is running but was not started here; it is used, never stopped.
      items+=("$d|$running|$pid|true")
      n_up=$((n_up + 1))
    else
      items+=("$d|$running|$pid|false")
    fi
  done
  local overall=down rc=3
  if ((n_up == n)); then overall=up; rc=0; elif ((n_up > 0)); then overall=partial; rc=4; fi
  if daemon_pid slurmctld >/dev/null; then ns=$(node_state || true); fi
  if ((json)); then
    local first=1 name r p ext
    printf '{"status":"%s","state_dir":"%s","cluster":"%s","account":"%s","partition":"%s","node_state":"%s","daemons":[' \
      "$overall" "$P" "$CLUSTER" "$ACCOUNT" "$PARTITION" "$ns"
    for d in "${items[@]}"; do
      IFS='|' read -r name r p ext <<<"$d"
      ((first)) || printf ','
      first=0
      printf '{"name":"%s","running":%s,"pid":%s,"external":%s}' "$name" "$r" "${p:-null}" "$ext"
    done
    printf ']}\n'
  else
    for d in "${items[@]}"; do
      IFS='|' read -r name r p ext <<<"$d"
      if [[ $r == true ]]; then echo "$name: running (pid $p)"
      elif [[ $ext == true ]]; then echo "$name: running (not started by this script)"
      else echo "$name: stopped"; fi
    done
    echo "cluster: $overall (state $P${ns:+, node $ns})"
  fi
  return $rc
}

cmd_purge() {
  need_root "purge"
  cmd_down
  local f
  for f in "$SLURM_CONF_FILE" "$DBD_CONF_FILE" "$GRES_CONF_FILE"; do
    if [[ -e $f ]] && grep -qxF "$MARK" "$f"; then rm -f "$f"; say "removed $f"; fi
  done
  if [[ -d $P ]]; then rm -rf "$P"; say "removed $P"; fi
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) shift; cmd_status "$@" ;;
  purge) cmd_purge ;;
  *) echo "usage: $0 {up|down|status [--json]|purge}" >&2; exit 2 ;;
esac
