#!/usr/bin/env bash
# Checks what `cargo package` would publish (CI runs this): no warning, and the file list holds what a user needs and
# nothing else. Required: the manifest, the front page, the changelog, both licenses, the library, and the docs the
# crate docs and the README point to (src/lib.rs includes docs/design.md and docs/loom.md with include_str!, so the
# package would not build without them). Allowed besides: library sources, docs, and the examples', tests' and benches'
# sources. Anything else (.ci, scripts, loom-tests, policies, harness, logs, data) fails the check, the charts under
# docs/charts/ included: the README shows them by relative path from the repository (where they must exist, checked
# below), and the package, which no page renders them from, stays without them. Needs no network once the
# dependencies are in cargo's cache; writes only target/package/.
set -euo pipefail
cd "$(dirname "$0")/.."

packaged=$(cargo package --list --allow-dirty 2>/dev/null)
missing=""
for f in Cargo.toml README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE src/lib.rs docs/design.md docs/loom.md \
    docs/benchmarks.md; do
    grep -qxF "$f" <<<"$packaged" || missing+=" $f"
done
allowed='\.cargo_vcs_info\.json|Cargo\.(toml|toml\.orig|lock)|README\.md|CHANGELOG\.md|LICENSE-(MIT|APACHE)'
allowed+='|src/([a-z0-9_]+/)?[a-z0-9_]+\.rs|docs/[a-z0-9_-]+\.md|(examples|tests|benches)/[a-z0-9_]+\.rs|tests/common/[a-z0-9_]+\.rs'
unexpected=$(grep -Evx "$allowed" <<<"$packaged" || true)
if [ -n "$missing" ] || [ -n "$unexpected" ]; then
    echo "package: missing:${missing:- none}" >&2
    echo "package: unexpected: $(tr '\n' ' ' <<<"${unexpected:-none}")" >&2
    exit 1
fi
# Every chart the README shows is in the repository.
for chart in $(grep -o 'docs/charts/[A-Za-z0-9_.-]*\.svg' README.md | sort -u); do
    [ -f "$chart" ] || { echo "package: the README shows $chart, which does not exist" >&2; exit 1; }
done
# Packaging (without the verification build) is what reports targets left out and missing metadata.
out=$(cargo package --no-verify --allow-dirty 2>&1)
if grep -qi 'warning' <<<"$out"; then
    echo "cargo package warns:" >&2
    grep -i 'warning' <<<"$out" >&2
    exit 1
fi
echo "package: $(wc -l <<<"$packaged") files, no warning"
