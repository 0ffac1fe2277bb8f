#!/bin/sh
# The Slurm integration tests (tests/slurm/) start real daemons: munged, slurmctld, one slurmd per node.
# When Debian's packages are missing this installs them with apt-get as root (or sudo -n), and says so
# first; APT=no or BANDPILOT_NO_APT=1 declines, and those tests then skip with their reason.
# APT_GET names the program (the tests of this script set it).
if [ -z "$APT_GET" ]; then
  if [ "$(id -u)" = 0 ]; then APT_GET=apt-get; else APT_GET="sudo -n apt-get"; fi
fi
PKGS="slurmctld slurmd slurm-client munge"
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
  && command -v munged >/dev/null && exit 0
if [ "$APT" = no ] || [ -n "$BANDPILOT_NO_APT" ]; then
  echo "slurm: Slurm not installed and APT=no: the real-Slurm tests will skip"
  exit 0
fi
echo "slurm: installing Debian's $PKGS (system-wide, with $APT_GET) for the tests that run against" \
     "real Slurm daemons; run \`make test APT=no\` (or set BANDPILOT_NO_APT=1) to skip them"
DEBIAN_FRONTEND=noninteractive $APT_GET install -y -q --no-install-recommends $PKGS >/dev/null 2>&1 ||
  { $APT_GET update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $APT_GET install -y -q --no-install-recommends $PKGS >/dev/null 2>&1; } ||
  { echo "slurm: could not install $PKGS; the real-Slurm tests will skip"; exit 0; }
echo "slurm: installed $PKGS"
