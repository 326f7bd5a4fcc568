//! The project's container images, built for the tests by a real engine (podman 4 / buildah from
//! Debian) with private storage: `debian:bookworm-slim` bootstrapped from Debian's packages
//! (no registry pull; cached as a tarball), the `Dockerfile`'s targets fed the binaries this test
//! run built (`BINARIES=prebuilt`), small derived images, and `docker-archive`s of them for a
//! node's containerd. Must not: use the machine's own podman storage, reach a registry, or create
//! links in the root network namespace (`--network host` only for a build's `apt-get`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use crate::binaries::{REFERENCE_PLUGINS, built_binary, reference_plugin, static_ipamd};

/// Where the bootstrapped Debian rootfs tarball is kept across runs.
pub const CACHE_DIR: &str = "/var/tmp/aws-vpc-cni-rs-image-cache";
/// The base image's registry name, as the `Dockerfile` names it.
pub const BASE: &str = "docker.io/library/debian:bookworm-slim";
/// The workspace binaries the `Dockerfile`'s `bins-prebuilt` stage copies.
pub const BINARIES: [&str; 6] = [
    "ipamd",
    "aws-cni",
    "egress-cni",
    "aws-cni-conflist",
    "grpc-health-probe",
    "cni-metrics-helper",
];

/// Apt sources as the registry's `debian:bookworm-slim` has them (debootstrap writes only
/// `bookworm main`).
const DEBIAN_SOURCES: &str = "Types: deb\nURIs: http://deb.debian.org/debian\n\
Suites: bookworm bookworm-updates\nComponents: main\n\
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\
Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

/// A podman with private storage; its containers and images are removed on drop.
#[derive(Debug)]
pub struct Engine {
    dir: tempfile::TempDir,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// A fresh private storage under `/var/tmp`.
    #[must_use]
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("aws-vpc-cni-rs-image-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        for sub in ["root", "runroot", "tmp"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        Self { dir }
    }

    /// The engine's directory (storage, scratch contexts).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `podman` with this engine's storage.
    #[must_use]
    pub fn podman(&self) -> Command {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(self.dir.path().join("root"))
            .arg("--runroot")
            .arg(self.dir.path().join("runroot"))
            .args([
                "--storage-driver",
                "overlay",
                "--cgroup-manager",
                "cgroupfs",
            ])
            .args(["--events-backend", "file"])
            .env("TMPDIR", self.dir.path().join("tmp"));
        c
    }

    /// Runs podman with `args`.
    #[must_use]
    pub fn run(&self, args: &[&str]) -> Output {
        self.podman()
            .args(args)
            .output()
            .expect("podman is installed (integration/test.sh)")
    }

    /// Runs podman with `args`; panics with its output when it fails; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Imports the bootstrapped base under [`BASE`] (once per engine is enough).
    pub fn import_base(&self) {
        self.ok(&["import", &base_tarball().display().to_string(), BASE]);
    }

    /// Builds the `Dockerfile`'s `target` (None: the default, aws-node) as `tag` from the
    /// binaries of this test run (`BINARIES=prebuilt`). [`Engine::import_base`] first.
    pub fn build_target(&self, target: Option<&str>, tag: &str) {
        let started = Instant::now();
        let ctx = self.dir.path().join("context");
        prebuilt_context(&ctx);
        let dockerfile = repo().join("Dockerfile").display().to_string();
        let ctx = ctx.display().to_string();
        // `--network host`: the build's apt-get needs the network; host networking creates
        // nothing in the root netns (the default bridge would add links and iptables rules).
        let mut args = vec![
            "build",
            "--network",
            "host",
            "--pull=never",
            "--build-arg",
            "BINARIES=prebuilt",
            "--file",
            &dockerfile,
            "--tag",
            tag,
        ];
        if let Some(t) = target {
            args.extend(["--target", t]);
        }
        args.push(&ctx);
        self.ok(&args);
        let size = self.ok(&["image", "inspect", "--format", "{{.Size}}", tag]);
        eprintln!(
            "image: built {tag} in {:.0?}, size {} MB",
            started.elapsed(),
            size.trim().parse::<u64>().unwrap_or(0) / 1_000_000
        );
    }

    /// Builds `containerfile` with the files `files` (name → content; mode 0755) in its
    /// context, as `tag`.
    pub fn build_from(&self, tag: &str, containerfile: &str, files: &[(&str, FileSource<'_>)]) {
        let ctx = tempfile::Builder::new()
            .prefix("ctx-")
            .tempdir_in(self.dir.path())
            .expect("context dir");
        std::fs::write(ctx.path().join("Containerfile"), containerfile).expect("Containerfile");
        for (name, src) in files {
            let dst = ctx.path().join(name);
            match src {
                FileSource::Copy(p) => {
                    std::fs::copy(p, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", p.display()));
                }
                FileSource::Text(t) => {
                    std::fs::write(&dst, t).expect("write");
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755))
                        .expect("chmod");
                }
            }
        }
        let cf = ctx.path().join("Containerfile").display().to_string();
        let c = ctx.path().display().to_string();
        self.ok(&[
            "build",
            "--network",
            "none",
            "--pull=never",
            "--file",
            &cf,
            "--tag",
            tag,
            &c,
        ]);
    }

    /// Saves `tags` into one `docker-archive` at `path` (what `ctr images import` reads).
    pub fn save(&self, tags: &[&str], path: &Path) {
        let p = path.display().to_string();
        let mut args = vec!["save", "-m", "--format", "docker-archive", "-o", &p];
        args.extend(tags);
        self.ok(&args);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "2"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        let _ = self.run(&["system", "reset", "--force"]);
    }
}

/// A file of a [`Engine::build_from`] context.
#[derive(Debug, Clone, Copy)]
pub enum FileSource<'a> {
    /// Copied from this path (mode kept).
    Copy(&'a Path),
    /// This text, executable.
    Text(&'a str),
}

/// The repository root.
#[must_use]
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo")
        .to_owned()
}

/// Fills `ctx` with what the `Dockerfile` copies under `BINARIES=prebuilt`: this run's binaries
/// (ipamd and the two plugins: their static builds, as the image ships them; stripped)
/// and the static reference plugins in `prebuilt/`, the support collector, the chart's scripts
/// and default conflist template (modes kept).
pub fn prebuilt_context(ctx: &Path) {
    std::fs::create_dir_all(ctx.join("prebuilt")).expect("mkdir");
    for b in BINARIES {
        // ipamd as the image ships it: the static build (with the test-only in-memory EC2)
        let bin = if b == "ipamd" {
            static_ipamd()
        } else {
            built_binary(b)
        };
        // Symbols and debug info stripped on the way in (`strip --strip-all`): half of a
        // test-profile binary's size, which every build, save and node import would otherwise
        // copy and hash (docs/testing.md, "Container image").
        sh(Command::new("strip")
            .arg("--strip-all")
            .arg("-o")
            .arg(ctx.join("prebuilt").join(b))
            .arg(bin));
    }
    std::fs::create_dir_all(ctx.join("prebuilt/reference")).expect("mkdir");
    for p in REFERENCE_PLUGINS {
        std::fs::copy(reference_plugin(p), ctx.join("prebuilt/reference").join(p))
            .expect("copy reference plugin");
    }
    let repo = repo();
    std::fs::create_dir_all(ctx.join("scripts")).expect("mkdir");
    std::fs::copy(
        repo.join("scripts/aws-cni-support.sh"),
        ctx.join("scripts/aws-cni-support.sh"),
    )
    .expect("copy aws-cni-support.sh");
    let files = Path::new("charts/aws-vpc-cni/files");
    std::fs::create_dir_all(ctx.join(files)).expect("mkdir");
    for f in ["aws-node.sh", "aws-vpc-cni-init.sh", "10-aws.conflist"] {
        std::fs::copy(repo.join(files).join(f), ctx.join(files).join(f))
            .unwrap_or_else(|e| panic!("copy {f}: {e}"));
    }
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The bootstrapped `debian:bookworm-slim` rootfs as a tarball, built once and cached.
#[must_use]
pub fn base_tarball() -> PathBuf {
    let cache = Path::new(CACHE_DIR);
    let tar = cache.join("debian-bookworm-minbase.tar");
    if tar.exists() {
        return tar;
    }
    std::fs::create_dir_all(cache).expect("cache dir");
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("bootstrap-")
        .tempdir_in(cache)
        .expect("tempdir");
    let rootfs = work.path().join("rootfs");
    sh(Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&rootfs)
        .arg("http://deb.debian.org/debian"));
    let _ = std::fs::remove_file(rootfs.join("etc/apt/sources.list"));
    std::fs::write(
        rootfs.join("etc/apt/sources.list.d/debian.sources"),
        DEBIAN_SOURCES,
    )
    .expect("sources");
    for d in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        for e in std::fs::read_dir(rootfs.join(d))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let partial = work.path().join("base.tar");
    sh(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["--numeric-owner", "-cf"])
        .arg(&partial)
        .arg("."));
    std::fs::rename(&partial, &tar).expect("publish tarball");
    eprintln!(
        "image: bootstrapped {BASE} from Debian's packages in {:.0?}",
        started.elapsed()
    );
    tar
}
