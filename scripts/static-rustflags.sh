#!/bin/sh
# Prints the rustc flags of every fully static build (CARGO_ENCODED_RUSTFLAGS form: separated by
# 0x1f): glibc linked in (`-C target-feature=+crt-static`: no ELF interpreter, no NEEDED
# libraries) and non-PIE (`-C relocation-model=static`: ET_EXEC at a fixed address, nothing to
# relocate at start), plus the v0 mangling every build of this workspace uses (.cargo/config.toml;
# CARGO_ENCODED_RUSTFLAGS replaces its flags, so it is repeated here). docs/image.md ("glibc")
# says why. Used with `--target <host triple>`, which keeps the flags away from build scripts and
# proc-macros, by scripts/build-static-plugins.sh, scripts/build-static-ipamd.sh and
# integration/test.sh (the test build, docs/testing.md "One build").
printf '%s\037%s\037%s' -Ctarget-feature=+crt-static -Crelocation-model=static \
  -Csymbol-mangling-version=v0
