//! Running a program inside a named network namespace the way `ip netns exec` runs it, without
//! the `ip` process: the child enters the namespace between fork and exec. Must not: change the
//! calling process's (or thread's) namespaces or mounts, or enter a namespace it was not named.
//!
//! Why not `ip netns exec`: iproute2's `ip` is dynamically linked against eight libraries, and
//! its start-up is most of its cost — 0.12 s a process inside the test VM's TCG emulation
//! against 0.02 s for this fork, measured there with a 150 MB parent (docs/testing.md, "Where
//! `sgp_ipamd_vm`'s time goes"). The harnesses run one for every plugin call, every `ipamd`
//! start and every probe of a namespace.

use std::ffi::{CString, OsStr};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::stat::Mode;
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::fabric::names::NETNS_DIR;

/// A `Command` for `program` that runs inside network namespace `ns` (`/run/netns/<ns>`, where `ip netns add` puts it) as
/// `ip netns exec <ns> <program>` would run it.
#[must_use]
pub fn command_in(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    enter_in_child(&mut command, ns);
    command
}

/// Makes `command`'s child enter network namespace `ns` before it executes, then a mount
/// namespace of its own in which `/sys` is that network namespace's sysfs (so `/sys/class/net`
/// lists the namespace's links; mounts propagate from the parent's namespace one way only), as
/// `ip netns exec` does. A namespace that does not exist fails the spawn (`ENOENT`).
///
/// The workspace's one other `unsafe` is ipamd's `madvise`; this one is `pre_exec`, whose
/// closure runs in the forked child.
#[allow(unsafe_code)]
pub fn enter_in_child(command: &mut Command, ns: &str) {
    // Everything the child needs is prepared here: between fork and exec only system calls run
    // (no allocation: the parent may have had other threads holding the allocator's lock).
    let path = CString::new(format!("{NETNS_DIR}/{ns}")).unwrap_or_default();
    let name = CString::new(ns).unwrap_or_default();
    let root = c"/";
    let sys = c"/sys";
    let sysfs = c"sysfs";
    let none = c"none";
    // SAFETY: the closure only makes system calls on data prepared above (nix passes `CStr`s
    // through without allocating); no lock, no allocation, no thread.
    unsafe {
        command.pre_exec(move || {
            let fd = open(
                path.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            setns(&fd, CloneFlags::CLONE_NEWNET)?;
            drop(fd);
            unshare(CloneFlags::CLONE_NEWNS)?;
            mount(
                Some(none),
                root,
                None::<&std::ffi::CStr>,
                MsFlags::MS_SLAVE | MsFlags::MS_REC,
                None::<&std::ffi::CStr>,
            )?;
            let read_only = statvfs(sys).is_ok_and(|s| s.flags().contains(FsFlags::ST_RDONLY));
            // Not mounted is fine (`ip` goes on too); the new sysfs goes on top either way.
            let _ = umount2(sys, MntFlags::MNT_DETACH);
            let flags = if read_only {
                MsFlags::MS_RDONLY
            } else {
                MsFlags::empty()
            };
            mount(
                Some(name.as_c_str()),
                sys,
                Some(sysfs),
                flags,
                None::<&std::ffi::CStr>,
            )?;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::exec;

    /// A namespace of this test's own, deleted on drop.
    struct Ns(String);

    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = exec::netns_del(&self.0);
        }
    }

    /// The child sees the namespace's links (netlink and `/sys/class/net` alike), the parent
    /// is untouched, a missing namespace fails the spawn.
    #[test]
    fn a_child_runs_in_the_namespace_with_its_sysfs() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: needs root (network namespaces)");
            return;
        }
        let ns = Ns(format!("vsimnx{}", std::process::id()));
        exec::netns_add(&ns.0).expect("netns add");
        exec::ip(
            &ns.0,
            &["link", "add", "nxa0", "type", "veth", "peer", "nxb0"],
        )
        .expect("veth");
        let out = command_in(&ns.0, "sh")
            .args(["-c", "ls /sys/class/net; ip -o link show | cut -d: -f2"])
            .output()
            .expect("spawn in the namespace");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let sys: Vec<&str> = text.lines().take_while(|l| !l.starts_with(' ')).collect();
        assert!(sys.contains(&"nxa0") && sys.contains(&"nxb0"), "{text}");
        assert!(text.contains(" nxa0@nxb0"), "{text}");
        // The parent's own view did not change.
        let here = std::fs::read_dir("/sys/class/net")
            .expect("sysfs")
            .filter_map(|e| e.ok())
            .any(|e| e.file_name() == "nxa0");
        assert!(!here, "the parent must not see the namespace's links");
        let missing = command_in("vsimnx-no-such-namespace", "true").status();
        assert!(missing.is_err(), "{missing:?}");
    }
}
