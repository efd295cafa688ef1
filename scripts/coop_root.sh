#!/usr/bin/env bash
# Runs a test binary on a lavapipe with cooperative matrices: Debian 12's Mesa (22.3) has none,
# Debian 13's backports (Mesa 26) offer 8x8 f16 ones, so the binary runs inside a Debian 13 root
# made from Debian's packages (debootstrap; the binary's glibc 2.36 needs are met by 2.41).
#
#   scripts/coop_root.sh TEST_BINARY [ARGS...]
#
# The root is made once at $LOCKSTEP_COOP_ROOT (default /var/cache/lockstep/coop-root, about
# 400 MB) and reused while its marker file is there. Needs root (chroot, mount) and the network
# to Debian's mirror.
set -euo pipefail
root="${LOCKSTEP_COOP_ROOT:-/var/cache/lockstep/coop-root}"
binary="${1:?usage: coop_root.sh TEST_BINARY [ARGS...]}"
shift
mirror=http://deb.debian.org/debian

if [ ! -e "$root/.lockstep-ready" ]; then
    command -v debootstrap >/dev/null || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase --include=libvulkan1,spirv-tools trixie "$root" "$mirror" >/dev/null
    echo "deb $mirror trixie-backports main" >"$root/etc/apt/sources.list.d/backports.list"
    chroot "$root" apt-get update -qq
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t trixie-backports mesa-vulkan-drivers >/dev/null
    touch "$root/.lockstep-ready"
fi
# spirv-val for the tier's own SPIR-V (Debian 12's is too old for cooperative matrices); a root
# made before it was needed gets it here.
if ! chroot "$root" sh -c 'command -v spirv-val' >/dev/null; then
    chroot "$root" apt-get update -qq
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spirv-tools >/dev/null
fi
echo "Mesa in the root: $(chroot "$root" dpkg-query -W -f='${Version}' mesa-vulkan-drivers)"

mounted=()
cleanup() { for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || true; done; rm -f "$root/tmp/lockstep-test"; }
trap cleanup EXIT
for m in proc dev; do
    if ! mountpoint -q "$root/$m"; then
        if [ "$m" = proc ]; then mount -t proc proc "$root/proc"; else mount --bind /dev "$root/dev"; fi
        mounted+=("$root/$m")
    fi
done
cp "$binary" "$root/tmp/lockstep-test"
# The tier's switches (LOCKSTEP_WGPU_COOP*) pass through; nothing else of this environment does.
mapfile -t switches < <(env | grep '^LOCKSTEP_WGPU_COOP' || true)
chroot "$root" env -i PATH=/usr/bin:/bin HOME=/tmp XDG_RUNTIME_DIR=/tmp LOCKSTEP_EXPECT_WGPU=1 LOCKSTEP_EXPECT_COOP=1 \
    "${switches[@]}" /tmp/lockstep-test "$@"
