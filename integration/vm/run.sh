#!/usr/bin/env bash
# Runs one command inside a throwaway VM on Debian's cloud kernel (qemu, TCG: no KVM needed),
# for kernel features this machine's kernel lacks (802.1Q vlan, dummy, ipvlan, ipip).
#
#   integration/vm/run.sh [--modules m1,m2] [--mem MiB] [--cpus N] [--timeout S]
#                         [--console FILE] [--env NAME=VALUE]... -- COMMAND [ARG]...
#
# The VM's root filesystem is this machine's own root (virtiofsd shares a read-only bind of `/`
# made in a private mount namespace, so /proc, /sys, /dev and other mounts are not shared)
# under a RAM overlay: every binary and tool is at the same path as here, and nothing the
# command writes reaches this machine. The command runs as root in the VM's working directory
# = this one, with a private, empty network stack (no NIC). Its stdout and stderr (one stream,
# the second serial port) are printed on stdout when the VM has stopped; the kernel console
# goes to --console (default: a file in the job directory, removed afterwards). Exit status:
# the command's; 77 when qemu, virtiofsd or the kernel is missing (the caller skips); 124 when
# the VM did not finish within --timeout; 125 when the VM did not start the command.
# docs/testing.md, "Tests in a VM".
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
modules=""
mem=1024
cpus=2
timeout_s=600
console=""
envs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --modules) modules=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --console) console=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "vm: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "vm: no command" >&2; exit 2; }

qemu=$(command -v qemu-system-x86_64 || true)
# qemu's own virtiofsd (Debian 12: qemu-system-common), else the standalone Rust one (Debian
# 13+: package virtiofsd), whose options differ.
virtiofsd=/usr/lib/qemu/virtiofsd
[ -x "$virtiofsd" ] || virtiofsd=/usr/libexec/virtiofsd
kernel=${VM_KERNEL:-$(ls -1 /boot/vmlinuz-*-cloud-amd64 2>/dev/null | sort -V | tail -n 1 || true)}
busybox=/bin/busybox
missing=()
[ -n "$qemu" ] || missing+=("qemu-system-x86_64 (apt: qemu-system-x86)")
[ -x "$virtiofsd" ] || missing+=("virtiofsd (apt: qemu-system-x86, or virtiofsd on Debian 13+)")
[ -n "$kernel" ] && [ -r "$kernel" ] || missing+=("/boot/vmlinuz-*-cloud-amd64 (apt: linux-image-cloud-amd64)")
if [ -x "$busybox" ] && ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
  missing+=("a static /bin/busybox (apt: busybox-static)")
fi
[ -x "$busybox" ] || missing+=("/bin/busybox (apt: busybox-static)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "vm: missing ${missing[*]}" >&2
  exit 77
fi
kver=${kernel#/boot/vmlinuz-}
moddir=/lib/modules/$kver
[ -d "$moddir" ] || { echo "vm: missing $moddir (apt: linux-image-cloud-amd64)" >&2; exit 77; }

jobroot=/var/tmp/aws-vpc-cni-vm
mkdir -p "$jobroot"
job=$(mktemp -d "$jobroot/$$-XXXXXX")
fsd_pid=""
cleanup() {
  if [ -n "$fsd_pid" ]; then kill "$fsd_pid" 2>/dev/null || true; wait "$fsd_pid" 2>/dev/null || true; fi
  rm -rf "$job"
}
trap cleanup EXIT
[ -n "$console" ] || console=$job/console.log
out=$job/out.log

# The initramfs: static busybox, the modules that reach the share (and virtio-rng: without an
# entropy source the guest's CRNG took 20-40 s of uptime to initialise under TCG, stalling
# whatever waited for it; docs/testing.md), the two stages.
initrd_dir=$job/initrd
mkdir -p "$initrd_dir/bin" "$initrd_dir/modules"
cp "$busybox" "$initrd_dir/bin/busybox"
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio-rng fuse virtiofs overlay; do
  f=$(find "$moddir/kernel" -name "$m.ko" -print -quit)
  [ -n "$f" ] || { echo "vm: module $m not in $moddir" >&2; exit 77; }
  cp "$f" "$initrd_dir/modules/"
done
cp "$here/init" "$initrd_dir/init"
cp "$here/stage2" "$initrd_dir/stage2"
chmod +x "$initrd_dir/init"
(cd "$initrd_dir" && find . | "$busybox" cpio -o -H newc 2>/dev/null) >"$job/initrd.cpio"

# The job: the command in this working directory with the given environment.
{
  echo "cd $(printf %q "$PWD") || exit 125"
  echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  echo "export HOME=/root"
  for e in "${envs[@]+"${envs[@]}"}"; do echo "export $(printf %q "$e")"; done
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$job/job.sh"

# virtiofsd on a read-only, non-recursive bind of / in its own mount namespace, then qemu.
# A boot that has not started the command within $boot_s (stage 2 prints `vm-job-started`
# first; TCG gets there in ~2 s here, on a loaded machine in 20 s) is killed and tried once
# more: a rare TCG boot hung with an empty console and no output until the command's whole
# timeout ran out (docs/testing.md, "Tests in a VM"). A failure stage 2 reports (exit code on
# the console) is not retried.
boot_s=${VM_BOOT_TIMEOUT:-120}
stage=$job/root
mkdir -p "$stage"
start_virtiofsd() {
  sock=$job/fs.sock
  rm -f "$sock"
  if [ "$virtiofsd" = /usr/lib/qemu/virtiofsd ]; then
    fsd_args=(-o "source=$stage" -o sandbox=chroot -o cache=always -o log_level=err)
  else
    fsd_args=("--shared-dir=$stage" --sandbox=chroot --cache=always --log-level=error)
  fi
  unshare -m --propagation private sh -c '
    mount --bind / "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"
  ' sh "$stage" "$virtiofsd" --socket-path="$sock" "${fsd_args[@]}" 2>"$job/virtiofsd.log" &
  fsd_pid=$!
  for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || { echo "vm: virtiofsd did not start:" >&2; cat "$job/virtiofsd.log" >&2; exit 125; }
}
stop_virtiofsd() {
  if [ -n "$fsd_pid" ]; then kill "$fsd_pid" 2>/dev/null || true; wait "$fsd_pid" 2>/dev/null || true; fi
  fsd_pid=""
}

# The guest's clock: TCG's TSC comes from one host clock for every vCPU, but the guest kernel
# finds it "unsynchronized" and falls back to the emulated HPET, where every clock read is a
# system call and an emulated MMIO read (6.4 us a read against 2.5 us on the TSC, measured in
# this VM; tokio and tracing read the clock all the time). `-cpu max` was slower than qemu64 here
# (`ip` start-up 0.15 against 0.13 s).
attempt=1
while :; do
  : >"$console"
  : >"$out"
  start_virtiofsd
  set +e
  timeout --kill-after=5 "$timeout_s" "$qemu" \
    -machine pc,accel=tcg -cpu qemu64 -smp "$cpus" -m "$mem" \
    -object memory-backend-memfd,id=mem,size="${mem}M",share=on -numa node,memdev=mem \
    -chardev socket,id=fs0,path="$sock" \
    -device vhost-user-fs-pci,queue-size=1024,chardev=fs0,tag=hostroot \
    -object rng-random,id=rng0,filename=/dev/urandom -device virtio-rng-pci,rng=rng0 \
    -kernel "$kernel" -initrd "$job/initrd.cpio" \
    -append "console=ttyS0 quiet panic=-1 mitigations=off tsc=reliable clocksource=tsc vm.job=$job/job.sh vm.modules=$modules" \
    -nodefaults -no-user-config -display none -no-reboot \
    -serial file:"$console" -serial file:"$out" </dev/null >"$job/qemu.log" 2>&1 &
  qpid=$!
  booted=0
  for _ in $(seq 1 $((boot_s * 10))); do
    if grep -q -e '^vm-job-started' -e '^vm-exit-code=' "$console" 2>/dev/null; then
      booted=1
      break
    fi
    kill -0 "$qpid" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$booted" = 1 ] || ! kill -0 "$qpid" 2>/dev/null; then
    wait "$qpid"
    qrc=$?
    set -e
    break
  fi
  # The command did not start within $boot_s: stop this boot (timeout passes the TERM on).
  kill "$qpid" 2>/dev/null
  wait "$qpid" 2>/dev/null
  set -e
  stop_virtiofsd
  if [ "$attempt" -ge 2 ]; then
    echo "vm: the VM did not start the command within ${boot_s}s, twice; console tail:" >&2
    tail -n 40 "$console" >&2 || true
    exit 124
  fi
  echo "vm: the VM did not start the command within ${boot_s}s; booting it again" >&2
  attempt=$((attempt + 1))
done
cat "$out" 2>/dev/null || true
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "vm: no exit within ${timeout_s}s; console tail:" >&2
  tail -n 40 "$console" >&2 || true
  exit 124
fi
rc=$(sed -n 's/^vm-exit-code=\([0-9]*\).*/\1/p' "$console" | tail -n 1)
if [ -z "$rc" ]; then
  echo "vm: the VM stopped without running the command (qemu exit $qrc); qemu and console tail:" >&2
  cat "$job/qemu.log" >&2 || true
  tail -n 40 "$console" >&2 || true
  exit 125
fi
exit "$rc"
