#!/usr/bin/env bash
# Spark 4 runs on Java 17 or 21 only: say so plainly instead of failing deep inside py4j.
set -euo pipefail
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "lakesink: Java not found. Spark 4 needs Java 17 or 21 (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)." >&2
  exit 1
fi
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
if [[ "$major" != "17" && "$major" != "21" ]]; then
  echo "lakesink: found Java $version at $(command -v "$java_bin"); Spark 4 needs Java 17 or 21 (set JAVA_HOME)." >&2
  exit 1
fi
