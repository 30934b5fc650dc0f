# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings and helpers for deploy/local/{up,down,status}.
# Sourced, not executed. The environment variables are documented in `up`.

LOCAL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$LOCAL_DIR/../.." && pwd)"

RATIFIER_LOCAL_HOME="${RATIFIER_LOCAL_HOME:-$HOME/.cache/ratifier-local}"

RATIFIER_KAFKA_VERSION="${RATIFIER_KAFKA_VERSION:-4.4.0}"
RATIFIER_KAFKA_PORT="${RATIFIER_KAFKA_PORT:-9092}"
RATIFIER_KAFKA_CONTROLLER_PORT="${RATIFIER_KAFKA_CONTROLLER_PORT:-9093}"
RATIFIER_KAFKA_HEAP_OPTS="${RATIFIER_KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
# The JIT: C1 only. On this 2-core machine the broker shares its cores with the pipeline it
# serves, and C2 spent 1.4 to 8.5 s of CPU per flood test compiling (as much as the broker's
# request handling, still so after five floods); C1 code handles requests ~15 % slower, and
# compiles in a fraction of that (docs/operations.md, "The local broker's JIT"). A broker of
# its own, on its own cores, wants the default (set this to "").
RATIFIER_KAFKA_JIT_OPTS="${RATIFIER_KAFKA_JIT_OPTS--XX:TieredStopAtLevel=1}"
RATIFIER_KAFKA_WAIT="${RATIFIER_KAFKA_WAIT:-90}"
RATIFIER_KAFKA_RESET="${RATIFIER_KAFKA_RESET:-0}"
RATIFIER_LOG4J_VERSION="${RATIFIER_LOG4J_VERSION:-2.25.3}"
RATIFIER_KAFKA_JARS_DIR="${RATIFIER_KAFKA_JARS_DIR:-$RATIFIER_LOCAL_HOME/kafka-jars/$RATIFIER_KAFKA_VERSION}"
RATIFIER_KAFKA_DATA_DIR="${RATIFIER_KAFKA_DATA_DIR:-$RATIFIER_LOCAL_HOME/kafka-data}"

RATIFIER_REDIS_PORT="${RATIFIER_REDIS_PORT:-6379}"
RATIFIER_REDIS_WAIT="${RATIFIER_REDIS_WAIT:-20}"
RATIFIER_REDIS_DATA_DIR="${RATIFIER_REDIS_DATA_DIR:-$RATIFIER_LOCAL_HOME/redis-data}"

RATIFIER_PG_PORT="${RATIFIER_PG_PORT:-5432}"
RATIFIER_PG_WAIT="${RATIFIER_PG_WAIT:-20}"
RATIFIER_PG_CLUSTER="${RATIFIER_PG_CLUSTER:-main}"
RATIFIER_PG_USER="${RATIFIER_PG_USER:-ratifier}"
RATIFIER_PG_PASSWORD="${RATIFIER_PG_PASSWORD:-ratifier}"
RATIFIER_PG_DATABASES="${RATIFIER_PG_DATABASES:-ratifier ratifier_test}"

RATIFIER_STOP_WAIT="${RATIFIER_STOP_WAIT:-30}"
RATIFIER_BIN="${RATIFIER_BIN:-$REPO/.venv/bin/ratifier}"

RUN_DIR="$RATIFIER_LOCAL_HOME/run"
LOG_DIR="$RATIFIER_LOCAL_HOME/logs"
CONF_DIR="$RATIFIER_LOCAL_HOME/conf"

KAFKA_PID_FILE="$RUN_DIR/kafka.pid"
KAFKA_LOG="$LOG_DIR/kafka.log"         # log4j2 output
KAFKA_OUT="$LOG_DIR/kafka.out"         # JVM stdout/stderr
KAFKA_PROPS="$CONF_DIR/kafka-server.properties"
KAFKA_BOOTSTRAP="127.0.0.1:$RATIFIER_KAFKA_PORT"

REDIS_PID_FILE="$RUN_DIR/redis.pid"
REDIS_LOG="$LOG_DIR/redis.log"

PG_MARKER="$RUN_DIR/postgres.started"  # "<version> <cluster>" when up started it

log() { printf '%s\n' "$*"; }
warn() { printf '%s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

ensure_dirs() {
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$CONF_DIR"
}

# Print the last lines of a log file (for failure messages).
show_log_tail() {
  local file="$1" n="${2:-30}"
  if [[ -s "$file" ]]; then
    warn "----- last $n lines of $file -----"
    tail -n "$n" "$file" >&2 || true
    warn "----- end of $file -----"
  else
    warn "(log $file is empty or missing)"
  fi
}

# Is something (anything) listening on 127.0.0.1:PORT?
port_open() {
  local port="$1"
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

# pid_alive PID PATTERN -> true if PID runs and its command line contains PATTERN
# (guards against a recycled pid).
pid_alive() {
  local pid="$1" pattern="$2"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  # State Z (zombie) counts as dead.
  if [[ -r "/proc/$pid/stat" ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == "Z" ]]; then
    return 1
  fi
  local cmd
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"$pattern"* ]]
}

# pid_from_file FILE PATTERN -> prints pid when the file names a live matching process.
pid_from_file() {
  local file="$1" pattern="$2" pid
  [[ -f "$file" ]] || return 1
  pid="$(head -n1 "$file" 2>/dev/null | tr -dc '0-9')"
  pid_alive "$pid" "$pattern" || return 1
  printf '%s\n' "$pid"
}

# Pid of the process listening on 127.0.0.1:PORT, if `ss` can tell.
listener_pid() {
  local port="$1"
  command -v ss >/dev/null 2>&1 || return 1
  ss -H -ltnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2
}

# stop_pid NAME PID PATTERN: SIGTERM, wait up to RATIFIER_STOP_WAIT s, then SIGKILL.
stop_pid() {
  local name="$1" pid="$2" pattern="$3" waited=0
  pid_alive "$pid" "$pattern" || return 0
  log "$name: stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  while pid_alive "$pid" "$pattern"; do
    if (( waited >= RATIFIER_STOP_WAIT * 2 )); then
      warn "$name: pid $pid still running after ${RATIFIER_STOP_WAIT}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  if pid_alive "$pid" "$pattern"; then
    warn "$name: pid $pid did not exit"
    return 1
  fi
  log "$name: stopped"
}

# detach_fds CMD [ARGS...]: run CMD with every file descriptor above 2 closed, so
# a daemon it starts keeps neither our lock (fd 9) nor a caller's pipe open.
detach_fds() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  bash -c 'for fd in /proc/self/fd/*; do fd=${fd##*/}
             if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
           done; exec "$@"' detach_fds "$@"
}

redis_ping() {
  local out
  command -v redis-cli >/dev/null 2>&1 || return 1
  out="$(timeout 3 redis-cli -h 127.0.0.1 -p "$RATIFIER_REDIS_PORT" ping 2>/dev/null)" || return 1
  [[ "$out" == "PONG" ]]
}

kafka_ready() {
  python3 "$LOCAL_DIR/kafka_ready.py" --bootstrap "$KAFKA_BOOTSTRAP" --timeout "${1:-3}" "${@:2}"
}

pg_dsn() {
  local db="${1:-ratifier}"
  printf 'postgresql://%s:%s@127.0.0.1:%s/%s' \
    "$RATIFIER_PG_USER" "$RATIFIER_PG_PASSWORD" "$RATIFIER_PG_PORT" "$db"
}

pg_answers() {
  command -v pg_isready >/dev/null 2>&1 || return 1
  pg_isready -q -h 127.0.0.1 -p "$RATIFIER_PG_PORT" -t 2 >/dev/null 2>&1
}

# Prints "<version> <cluster> <status> <logfile>" for the Debian cluster on our port.
pg_cluster_for_port() {
  command -v pg_lsclusters >/dev/null 2>&1 || return 1
  pg_lsclusters -h 2>/dev/null | awk -v p="$RATIFIER_PG_PORT" '$3 == p { print $1, $2, $4, $7; exit }'
}
