#!/bin/sh
# Side-by-side client comparison against nginx `return 200` (access_log off):
#   TCP keep-alive:  wrk  vs blackbuck-load  (-t1 -c50)
#   UNIX socket:     h2load --h1 vs blackbuck-load  (-t1 -c50)
# Runs ROUNDS interleaved rounds of DURATION seconds; prints requests/s and
# client CPU (user+sys from /usr/bin/time) per request for every run.
# Usage: sh loadgen/bench-compare.sh [ROUNDS] [DURATION]
set -eu
ROUNDS=${1:-3}
DUR=${2:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$HERE/blackbuck-load
DIR=$(mktemp -d /tmp/bl-bench.XXXXXX)
PORT=${PORT:-18181}
mkdir -p "$DIR/logs"
cat > "$DIR/nginx.conf" <<CONF
daemon off;
master_process off;
worker_processes 1;
pid $DIR/nginx.pid;
error_log $DIR/error.log;
events { worker_connections 4096; }
http {
  client_body_temp_path $DIR/body; proxy_temp_path $DIR/proxy; fastcgi_temp_path $DIR/fcgi;
  uwsgi_temp_path $DIR/uwsgi; scgi_temp_path $DIR/scgi;
  access_log off;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$PORT;
    listen unix:$DIR/nginx.sock;
    location / { return 200 "hello\n"; }
  }
}
CONF
/usr/sbin/nginx -p "$DIR" -c "$DIR/nginx.conf" &
NGINX=$!
trap 'kill $NGINX 2>/dev/null; wait $NGINX 2>/dev/null; rm -rf "$DIR"' EXIT INT TERM
sleep 0.5

# run NAME CMD...: prints "NAME req/s CPU-per-request"
run() {
  name=$1; shift
  /usr/bin/time -f "%U %S" -o "$DIR/time" "$@" > "$DIR/out" 2>&1 || true
  case $name in
    h2load*) reqs=$(awk '/^requests:/ {print $4}' "$DIR/out"); rps=$(awk '/^finished in/ {print $4}' "$DIR/out") ;;
    *) reqs=$(awk '/requests in/ {print $1}' "$DIR/out"); rps=$(awk '/^Requests\/sec:/ {print $2}' "$DIR/out") ;;
  esac
  awk -v n="$name" -v r="$rps" -v q="$reqs" '{ printf "%-26s %12.0f req/s  %6.3f us CPU/request  (user %.2fs sys %.2fs)\n", n, r, ($1+$2)*1e6/q, $1, $2 }' "$DIR/time" | tee -a "$DIR/all"
}

wrk_tcp() { run "wrk tcp" wrk -t1 -c50 -d"${DUR}s" "http://127.0.0.1:$PORT/"; }
bl_tcp() { run "blackbuck-load tcp" "$BIN" -t1 -c50 -d"${DUR}s" "http://127.0.0.1:$PORT/"; }
h2_unix() { run "h2load --h1 unix" h2load --h1 -t1 -c50 -D "$DUR" -B "unix:$DIR/nginx.sock" "http://localhost/"; }
bl_unix() { run "blackbuck-load unix" "$BIN" -t1 -c50 -d"${DUR}s" -P "$DIR/nginx.sock" "http://localhost/"; }

: > "$DIR/all"
# Alternate who goes first, so neither client always gets the warmer (or busier) slot.
for i in $(seq "$ROUNDS"); do
  echo "--- round $i"
  if [ $((i % 2)) -eq 1 ]; then wrk_tcp; bl_tcp; h2_unix; bl_unix; else bl_tcp; wrk_tcp; bl_unix; h2_unix; fi
done

# Medians over the rounds (the machine may be shared: single runs are noisy).
echo "--- medians over $ROUNDS rounds"
for name in "wrk tcp" "blackbuck-load tcp" "h2load --h1 unix" "blackbuck-load unix"; do
  grep "^$name  " "$DIR/all" | awk '{ print $(NF-8), $(NF-6) }' | sort -n -k1 > "$DIR/rps"
  rps=$(awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }' "$DIR/rps")
  cpu=$(sort -n -k2 "$DIR/rps" | awk '{ a[NR] = $2 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
  printf "%-26s %12.0f req/s  %6.3f us CPU/request\n" "$name" "$rps" "$cpu"
done
