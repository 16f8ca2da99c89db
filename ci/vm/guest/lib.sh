# Helpers for guest scripts (busybox sh). Source with:  . "${0%/*}/lib.sh"
# Fork+exec costs milliseconds under TCG, so these read sysfs/procfs with the `read` builtin.
# busybox ash prefers its own applets to $PATH: call iproute2 as $IP / $RDMA (full paths).
IP=/usr/bin/ip
RDMA=/usr/bin/rdma

now() { read -r NOW _ < /proc/uptime; }          # sets NOW (guest seconds, 2 decimals)

# roce_v2_gid DEV IPV4_HEX_TAIL -> sets GID_INDEX to the RoCE v2 GID index whose GID is
# ::ffff:<IPv4> (e.g. 0a00:0002 for 10.0.0.2); returns 1 and GID_INDEX=-1 when not found.
# Reads only gids/0..7: the table has 1024 entries and looping over all of them takes seconds.
roce_v2_gid() {
  GID_INDEX=-1
  for _i in 0 1 2 3 4 5 6 7; do
    _g=; read -r _g 2>/dev/null < /sys/class/infiniband/$1/ports/1/gids/$_i
    case $_g in
      *:ffff:$2)
        _t=; read -r _t 2>/dev/null < /sys/class/infiniband/$1/ports/1/gid_attrs/types/$_i
        case $_t in *v2*) GID_INDEX=$_i; return 0 ;; esac ;;
    esac
  done
  return 1
}

# counter IFACE rx|tx -> sets COUNT to the interface's packet counter
counter() { COUNT=0; read -r COUNT < /sys/class/net/$1/statistics/${2}_packets; }

# wait_listen PORT [TENTHS [PID]]: wait until a TCP socket listens on PORT (default: up to 30 s);
# gives up early when process PID has exited
wait_listen() {
  _hex=$(printf '%04X' "$1"); _n=0
  while [ $_n -lt "${2:-300}" ]; do
    [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || return 1
    for _f in /proc/net/tcp /proc/net/tcp6; do
      while read -r _ _l _ _st _; do
        case "$_l:$_st" in *:$_hex:0A) return 0 ;; esac
      done < $_f
    done
    sleep 0.1; _n=$((_n + 1))
  done
  return 1
}

# pt_pair NAME TOOL SRV_DEV SRV_GID CLI_DEV CLI_GID SERVER_IP [perftest args...]
# Runs a perftest server on SRV_DEV and its client on CLI_DEV; outputs go to /tmp/NAME.srv and
# /tmp/NAME.cli, the guest seconds the pair took to PT_SECS. Returns nonzero when either side fails.
PT_PORT=18515
pt_pair() {
  _name=$1 _tool=$2 _sd=$3 _sg=$4 _cd=$5 _cg=$6 _dst=$7; shift 7
  PT_PORT=$((PT_PORT + 1))
  now; _t0=$NOW
  timeout 300 $_tool -d $_sd -x $_sg -F -p $PT_PORT "$@" > /tmp/$_name.srv 2>&1 &
  _spid=$!
  if ! wait_listen $PT_PORT 300 $_spid; then
    echo "pt_pair $_name: the $_tool server did not start listening"; cat /tmp/$_name.srv
    kill $_spid 2>/dev/null; wait $_spid; return 1
  fi
  timeout 300 $_tool -d $_cd -x $_cg -F -p $PT_PORT "$@" $_dst > /tmp/$_name.cli 2>&1
  _crc=$?
  [ $_crc = 0 ] || kill $_spid 2>/dev/null
  wait $_spid; _src=$?
  now; PT_SECS=$(awk -v a=$_t0 -v b=$NOW 'BEGIN { printf "%.1f", b - a }')
  if [ $_crc != 0 ] || [ $_src != 0 ]; then
    echo "pt_pair $_name: $_tool failed (client rc=$_crc, server rc=$_src)"
    echo "--- client:"; cat /tmp/$_name.cli; echo "--- server:"; cat /tmp/$_name.srv
    return 1
  fi
  return 0
}

# start_hogs NICE: one busy loop per vCPU at niceness NICE, their pids in $hogs (kill $hogs ends them)
start_hogs() {
  _n=$(nproc) _i=0
  while [ $_i -lt "$_n" ]; do
    nice -n "$1" sh -c 'while :; do :; done' &
    hogs="${hogs:-} $!"
    _i=$((_i + 1))
  done
}

# second_pair: a second wire, veth2 10.0.1.1 <-> veth3 10.0.1.2 (the same policy routing as
# /init's veth0/veth1, so that traffic crosses it), with rxe2 on veth2 and rxe3 on veth3: two
# NICs per side (rxe0+rxe2 against rxe1+rxe3) for NIC fusion. Sets RXE2_GID_INDEX and
# RXE3_GID_INDEX; returns 1 when the devices do not come up within 10 s.
second_pair() {
  _ip=/usr/bin/ip
  $_ip link add veth2 address 02:00:00:00:01:01 mtu "${RIVET_VM_MTU:-1500}" type veth \
    peer name veth3 address 02:00:00:00:01:02 mtu "${RIVET_VM_MTU:-1500}" || return 1
  $_ip addr add 10.0.1.1/24 dev veth2
  $_ip addr add 10.0.1.2/24 dev veth3
  for _i in veth2 veth3; do
    echo 1 > /proc/sys/net/ipv4/conf/$_i/accept_local
    echo 0 > /proc/sys/net/ipv4/conf/$_i/rp_filter
  done
  $_ip link set veth2 up
  $_ip link set veth3 up
  $_ip rule add pref 12 to 10.0.1.2 iif lo lookup 102
  $_ip route add 10.0.1.2 dev veth2 src 10.0.1.1 table 102
  $_ip rule add pref 13 to 10.0.1.1 iif lo lookup 103
  $_ip route add 10.0.1.1 dev veth3 src 10.0.1.2 table 103
  $_ip neigh replace 10.0.1.2 lladdr 02:00:00:00:01:02 dev veth2 nud permanent
  $_ip neigh replace 10.0.1.1 lladdr 02:00:00:00:01:01 dev veth3 nud permanent
  /usr/bin/rdma link add rxe2 type rxe netdev veth2 || return 1
  /usr/bin/rdma link add rxe3 type rxe netdev veth3 || return 1
  _n=0
  while [ $_n -lt 100 ]; do
    _s2=; _s3=
    read -r _s2 < /sys/class/infiniband/rxe2/ports/1/state
    read -r _s3 < /sys/class/infiniband/rxe3/ports/1/state
    case "$_s2$_s3" in
      *ACTIVE*ACTIVE*)
        if roce_v2_gid rxe2 0a00:0101; then
          RXE2_GID_INDEX=$GID_INDEX
          roce_v2_gid rxe3 0a00:0102 && { RXE3_GID_INDEX=$GID_INDEX; return 0; }
        fi ;;
    esac
    sleep 0.1; _n=$((_n + 1))
  done
  return 1
}

# wire_up N: bring wire N back after a test took it down (a link that goes down loses its
# routes): wire 0 is veth0 10.0.0.1 <-> veth1 10.0.0.2 (/init's, rxe0/rxe1), wire 1 is veth2
# 10.0.1.1 <-> veth3 10.0.1.2 (second_pair's, rxe2/rxe3). The links, routes and neighbours
# again, then until both rxe ports are ACTIVE (10 s).
wire_up() {
  _ip=/usr/bin/ip
  _a=$((2 * $1)); _b=$((2 * $1 + 1))
  $_ip link set veth$_a up
  $_ip link set veth$_b up
  $_ip route replace 10.0.$1.2 dev veth$_a src 10.0.$1.1 table $((100 + _a))
  $_ip route replace 10.0.$1.1 dev veth$_b src 10.0.$1.2 table $((100 + _b))
  $_ip neigh replace 10.0.$1.2 lladdr 02:00:00:00:0$1:02 dev veth$_a nud permanent
  $_ip neigh replace 10.0.$1.1 lladdr 02:00:00:00:0$1:01 dev veth$_b nud permanent
  _n=0
  while [ $_n -lt 100 ]; do
    read -r _sa < /sys/class/infiniband/rxe$_a/ports/1/state
    read -r _sb < /sys/class/infiniband/rxe$_b/ports/1/state
    case "$_sa$_sb" in *ACTIVE*ACTIVE*) return 0 ;; esac
    sleep 0.1; _n=$((_n + 1))
  done
  return 1
}

# wait_for FILE REGEX [COUNT [TENTHS [PID]]]: until FILE has COUNT (default 1) lines matching the
# extended REGEX (default: up to 60 s; a FILE not there yet has none); gives up early when process
# PID has exited. The VM steps
# order their events by this, not by fixed sleeps (a loaded host stretches every phase).
wait_for() {
  _wn=0
  while [ $_wn -lt "${4:-600}" ]; do
    _wc=$(grep -cE "$2" "$1" 2>/dev/null)
    [ "${_wc:-0}" -ge "${3:-1}" ] && return 0
    [ -z "${5:-}" ] || kill -0 "$5" 2>/dev/null || return 1
    sleep 0.1; _wn=$((_wn + 1))
  done
  return 1
}

# dump_threads COMM: every thread of every process named COMM, as the kernel sees it (state,
# wait channel, system call, kernel stack), and the process's executable mappings (to place a
# user-space address of the system call line): what a step that finds a process hanging prints.
dump_threads() {
  for _p in /proc/[0-9]*; do
    _c=; read -r _c 2>/dev/null < $_p/comm || continue
    [ "$_c" = "$1" ] || continue
    echo "# pid ${_p#/proc/}: $(tr '\0' ' ' < $_p/cmdline 2>/dev/null | cut -c1-160)"
    for _t in $_p/task/*; do
      _tc=; read -r _tc 2>/dev/null < $_t/comm
      echo "#   thread ${_t##*/} [$_tc] state $(awk '{print $3}' $_t/stat 2>/dev/null) wchan $(cat $_t/wchan 2>/dev/null) syscall $(cat $_t/syscall 2>/dev/null)"
      sed 's/^/#       /' $_t/stack 2>/dev/null | head -12
    done
    grep 'r-xp' $_p/maps 2>/dev/null | sed 's/^/#   map /'
  done
}
