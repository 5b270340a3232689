#!/bin/sh
# Runs in the lab's VM node at boot (coroner-vm-boot.service of the image, after it has
# mounted the lab's 9p shares): network, hostname, ssh key, then the node's systemd units
# (containerd 2.x and runc from the host's _output/bin, the images, the kubelet). The lab
# writes this file into the node's share from test/vm (embedded), with node.env beside it.
#
#   /opt/coroner/bin     _output/bin (read-only): kubelet, containerd2/{containerd,ctr,shim,runc}
#   /opt/coroner/images  _output/images (read-only): the image tarballs
#   /opt/coroner/node    _output/lab/nodes/NODE: node.env, configs, certificates; status is written here
#   /opt/coroner/logs    _output/lab/logs: containerd-NODE.log, kubelet-NODE.log, test-gpu-NODE.log
#
# `guest.sh images` is the import step, run by coroner-images.service.
set -eu
N=/opt/coroner/node
. "$N/node.env"
say() { echo "coroner-vm: $*" >/dev/console; echo "$(date -u +%FT%TZ) $*" >>"$N/status"; }

if [ "${1:-}" = images ]; then
	# In parallel (the emulated CPU hashes and unpacks slowly), and while the kubelet starts:
	# no pod comes to this node before the lab has seen "images imported" (vm.go).
	ctr=/opt/coroner/bin/containerd2/ctr
	pids=
	for t in $IMAGES; do
		"$ctr" -a "$SOCKET" -n k8s.io images import "/opt/coroner/images/$t" >/dev/null &
		pids="$pids $!"
	done
	for p in $pids; do
		wait "$p" || { say "images: an import failed"; exit 1; }
	done
	# The tarballs read over 9p fill the page cache: drop it, the balloon device reports
	# the free pages to QEMU, which gives them back to the host.
	sync
	echo 1 >/proc/sys/vm/drop_caches
	say "images imported: $IMAGES"
	exit 0
fi

: >"$N/status"
say "boot: guest.sh started ($(cut -d' ' -f1 /proc/uptime) s after the kernel)"
mkdir -p /opt/coroner/logs
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 corlog /opt/coroner/logs

hostname "$NODE_NAME"
echo "$NODE_NAME" >/etc/hostname
printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE_NAME" >/etc/hosts
cp "$N/resolv.conf" /etc/resolv.conf

ip link set lo up
ip addr add "$NODE_IP/24" dev eth0
ip link set eth0 up
ip route add default via "$GATEWAY"
for r in $ROUTES; do # CIDR=GW
	ip route add "${r%%=*}" via "${r#*=}"
done
sysctl -qw net.ipv4.ip_forward=1

if [ -f "$N/authorized_keys" ]; then
	install -d -m 700 /root/.ssh
	install -m 600 "$N/authorized_keys" /root/.ssh/authorized_keys
fi

# Facts for the lab: what a production-like node is made of.
{
	echo "kernel=$(uname -r)"
	echo "cgroupfs=$(stat -f -c %T /sys/fs/cgroup)"
	echo "controllers=$(cat /sys/fs/cgroup/cgroup.controllers)"
	echo "systemd=$(systemctl --version | head -n1 | cut -d' ' -f2)"
	echo "pid1=$(cat /proc/1/comm)"
} >"$N/facts"

mkdir -p /etc/coroner /etc/cni/net.d "$(dirname "$SOCKET")"
cp "$N/containerd.toml" "$N/kubelet.yaml" /etc/coroner/
cp "$N/10-coroner-lab.conflist" /etc/cni/net.d/
cat >/run/systemd/system/coroner-containerd.service <<UNIT
[Unit]
Description=containerd 2.x of the coroner lab (host-built, from 9p)
After=network.target local-fs.target
Before=coroner-kubelet.service
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/opt/coroner/bin/containerd2/containerd --config /etc/coroner/containerd.toml
StandardOutput=append:/opt/coroner/logs/containerd-$NODE_NAME.log
StandardError=append:/opt/coroner/logs/containerd-$NODE_NAME.log
Type=simple
Delegate=yes
KillMode=process
Restart=always
RestartSec=2
LimitNOFILE=infinity
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
UNIT
cat >/run/systemd/system/coroner-images.service <<UNIT
[Unit]
Description=coroner lab: import the image tarballs into containerd
Requires=coroner-containerd.service
After=coroner-containerd.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStartPre=/bin/sh -c 'until [ -S $SOCKET ]; do sleep 0.2; done'
ExecStart=/bin/sh $N/guest.sh images
UNIT
cat >/run/systemd/system/coroner-kubelet.service <<UNIT
[Unit]
Description=kubelet v1.36.3 of the coroner lab (systemd cgroup driver, cgroup v2)
Requires=coroner-containerd.service
Wants=coroner-images.service
After=coroner-containerd.service
[Service]
ExecStart=/opt/coroner/bin/kubelet --config=/etc/coroner/kubelet.yaml --kubeconfig=$N/pki/kubelet.kubeconfig --hostname-override=$NODE_NAME --node-ip=$NODE_IP --node-labels=$NODE_LABELS --v=1
StandardOutput=append:/opt/coroner/logs/kubelet-$NODE_NAME.log
StandardError=append:/opt/coroner/logs/kubelet-$NODE_NAME.log
Restart=always
RestartSec=2
OOMScoreAdjust=-999
UNIT
# The lab's test GPU plugin (test/deviceplugin), beside the kubelet: its devices in the
# kubelet's /var/lib/kubelet/device-plugins, its state in /var/lib/coroner-test-gpu, its Xid
# lines in this kernel's log, its control socket beside containerd's (the lab reaches it
# over ssh).
cat >/run/systemd/system/coroner-test-gpu.service <<UNIT
[Unit]
Description=coroner test GPU device plugin (coroner.dev/test-gpu)
After=coroner-kubelet.service
[Service]
ExecStart=/opt/coroner/bin/coroner-test-gpu $TEST_GPU_ARGS
StandardOutput=append:/opt/coroner/logs/test-gpu-$NODE_NAME.log
StandardError=append:/opt/coroner/logs/test-gpu-$NODE_NAME.log
Restart=always
RestartSec=2
UNIT
systemctl daemon-reload
systemctl start --no-block coroner-kubelet.service coroner-test-gpu.service
say "boot: network $NODE_IP, units started ($(cut -d' ' -f1 /proc/uptime) s after the kernel)"
