#!/bin/sh
# The dashboard test (tests/test_dashboard.py) drives Debian's chromium through chromedriver.
# When they are missing this installs them with apt-get as root (or sudo -n), and says so first;
# APT=no or BANDPILOT_NO_APT=1 declines, and the dashboard test then skips with its reason.
# CHROMIUM, CHROMEDRIVER and APT_GET name the programs (the tests of this script set them).
CHROMIUM=${CHROMIUM:-chromium}
CHROMEDRIVER=${CHROMEDRIVER:-chromedriver}
if [ -z "$APT_GET" ]; then
  if [ "$(id -u)" = 0 ]; then APT_GET=apt-get; else APT_GET="sudo -n apt-get"; fi
fi
command -v "$CHROMIUM" >/dev/null && command -v "$CHROMEDRIVER" >/dev/null && exit 0
if [ "$APT" = no ] || [ -n "$BANDPILOT_NO_APT" ]; then
  echo "browser: chromium/chromedriver not installed and APT=no: the dashboard test will skip"
  exit 0
fi
echo "browser: installing Debian's chromium and chromium-driver (system-wide, about 24 packages, with $APT_GET)" \
     "for the dashboard test; run \`make test APT=no\` (or set BANDPILOT_NO_APT=1) to skip it"
$APT_GET install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 ||
  { $APT_GET update -q >/dev/null 2>&1 && $APT_GET install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } ||
  { echo "browser: could not install chromium/chromedriver; the dashboard test will skip"; exit 0; }
echo "browser: installed chromium and chromium-driver"
