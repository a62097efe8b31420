# shellcheck shell=bash
# Sourced by test.sh --mounted, in a mount namespace of its own (every mount
# below disappears with it): builds the fresh root as an overlay on the cached
# base, fetches what `make dev` will need with the machine's network, then
# runs hack/fresh-machine/in-root.sh of the clone in a network and PID
# namespace of its own.
R=$IE_FM_RUN/root
# The root's writes: in memory (no removal to wait for, and dpkg's fsyncs cost
# nothing), or on disk with --keep, to be looked at after.
layer=$IE_FM_RUN
if [[ $IE_FM_KEEP != 1 ]]; then
  layer=$IE_FM_RUN/tmpfs
  mkdir -p "$layer"
  mount -t tmpfs -o size=6g tmpfs "$layer"
fi
mkdir -p "$layer/upper" "$layer/work"
mount -t overlay overlay -o "lowerdir=$IE_FM_CACHE/base,upperdir=$layer/upper,workdir=$layer/work" "$R"

# A minimal /dev: the usual nodes bound from the machine's, a private /dev/shm
# (PostgreSQL's shared memory) and pts.
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
for n in null zero full random urandom tty; do
  touch "$R/dev/$n"
  mount --bind "/dev/$n" "$R/dev/$n"
done
mkdir -p "$R/dev/shm" "$R/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"

# Go, the module cache (read-only) and the root's own build cache.
mkdir -p "$R/usr/local/go" "$R/root/go/pkg/mod" "$R/root/.cache/go-build" "$R/mnt/origin"
mount --bind -o ro "$IE_FM_GOROOT" "$R/usr/local/go"
mount --bind -o ro "$IE_FM_GOMODCACHE" "$R/root/go/pkg/mod"
mount --bind "$IE_FM_CACHE/gocache" "$R/root/.cache/go-build"
mount --bind -o ro "$IE_FM_RUN/origin" "$R/mnt/origin"
# The logs of the run, kept outside the root for test.sh.
mkdir -p "$R/root/fresh-machine-logs"
mount --bind "$IE_FM_RUN/logs" "$R/root/fresh-machine-logs"
# apt's downloads, kept between runs.
mount --bind "$IE_FM_CACHE/debs" "$R/var/cache/apt/archives"
cp -L /etc/resolv.conf "$R/etc/resolv.conf"
# As a Debian install writes it: this host's name on loopback (RabbitMQ's
# node is rabbit@<host>).
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" >"$R/etc/hosts"

in_root() { chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# With the machine's network: the package lists and the packages' files
# (nothing is installed), and the clone.
t=$SECONDS
in_root sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends --download-only $IE_FM_PACKAGES" \
  >"$IE_FM_RUN/apt-download.log" 2>&1 || { tail -20 "$IE_FM_RUN/apt-download.log" >&2; die "apt-get --download-only in the root"; }
log "package lists and $(ls "$IE_FM_CACHE"/debs/*.deb | wc -l) .debs in the root's /var/cache/apt/archives ($((SECONDS - t))s, with the network)"
in_root git clone -q /mnt/origin /root/idempotent-events || die "git clone in the root"
umount "$R/mnt/origin"
rm -f "$R/etc/resolv.conf"

# From here on, no network: a loopback only, in a network namespace of its
# own, and a PID namespace whose every process dies with in-root.sh.
log "make dev in the root, in its own network and PID namespaces"
unshare --net --pid --fork --mount-proc="$R/proc" -- /bin/bash -c '
  set -e
  ip link set lo up
  exec chroot "$1" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GOPROXY=off GOTOOLCHAIN=local GOFLAGS= \
    /bin/bash /root/idempotent-events/hack/fresh-machine/in-root.sh' _ "$R"
