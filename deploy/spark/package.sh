#!/usr/bin/env bash
# Write the `spark` and `bridge` packages (their Python sources) into a zip for spark-submit's
# --py-files: Spark puts it on the driver's and every executor's Python path, so the executors
# need only Python with pyspark, pyarrow and pandas (the versions the driver has).
#   deploy/spark/package.sh OUT.zip
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 1 ] || die "usage: package.sh OUT.zip"
"$SPARK_PYTHON" - "$REPO" "$1" <<'PY'
import sys
import zipfile
from pathlib import Path

repo, out = Path(sys.argv[1]), Path(sys.argv[2])
tmp = out.with_name(out.name + ".tmp")
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
    for package in ("spark", "bridge"):
        for source in sorted((repo / package).rglob("*.py")):
            archive.write(source, source.relative_to(repo).as_posix())
tmp.replace(out)  # a submit running meanwhile sees the old zip or the new one, never half
print(f"spark: {out} holds spark/ and bridge/")
PY
