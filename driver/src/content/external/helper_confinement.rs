//! What a helper may not ask of the kernel. A helper runs as its provider's user, with no
//! capability and no way to gain one (`helper_run`), but such a process can still reach parts of
//! the kernel that no helper needs and that have been the way out of containers: a new user
//! namespace (in which it holds every capability) and the other namespaces, mounts, tracing other
//! processes, BPF programs, kernel modules, the kernel's keyrings, userfaultfd, io_uring, the
//! clock. A seccomp filter refuses those calls with EPERM, and `clone3` with ENOSYS (its flags are
//! behind a pointer a filter cannot read), so that the C library falls back to `clone`, whose
//! namespace flags the filter does see.
//!
//! A filter holds for the process that installs it and for whatever that process executes, and
//! std has no safe way to run code in a child between its fork and its exec. So a helper is
//! started through the driver's own program: `sharedresource-csi-driver confine-helper -- HELPER
//! ARGUMENTS` installs the filter on itself (already as the helper's user, `no_new_privs`
//! inherited from the driver) and executes the helper in its place, which keeps its pid, its
//! process group, its pipes and its user. The driver names its program by `/proc/self/exe`
//! ([`confine_helpers_through_this_program`]), so an upgrade that replaces the file on disk does
//! not change what confines its helpers.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// The first argument that makes the driver's program the confining launcher of a helper.
pub const CONFINE_HELPER: &str = "confine-helper";

/// The program helpers are started through, when the process confines them.
static LAUNCHER: OnceLock<PathBuf> = OnceLock::new();

/// From now on, every helper this process runs is started through this very program, which
/// confines it before executing it. The driver's start calls this; a test or benchmark that
/// runs the plugin inside a program of its own does not (its program has no launcher), and its
/// helpers run unconfined.
pub fn confine_helpers_through_this_program() {
    let _ = LAUNCHER.set(PathBuf::from("/proc/self/exe"));
}

/// The program helpers are started through, if any: `Some` once
/// [`confine_helpers_through_this_program`] was called.
pub fn launcher() -> Option<&'static Path> {
    LAUNCHER.get().map(PathBuf::as_path)
}

/// The system calls refused with EPERM: never needed to fetch and print a secret, each a way
/// into the kernel that a helper with no capability could still take.
fn refused_calls() -> Vec<i64> {
    let mut calls = vec![
        // Namespaces: a new user namespace gives its creator every capability inside it.
        libc::SYS_unshare,
        libc::SYS_setns,
        // Mounts, old and new interfaces.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_mount_setattr,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        // Other processes' memory.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        // Kernel surfaces with a long record of escapes.
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_fanotify_init,
        // The machine's: modules, kexec, reboot, swap, accounting, the log, quotas, the clock.
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_syslog,
        libc::SYS_quotactl,
        libc::SYS_lookup_dcookie,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    calls
}

/// `clone`'s flags that make a new namespace: a rule each, any one set is refused.
const NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

fn target() -> Result<TargetArch, String> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err(format!("no seccomp filter is written for {}", std::env::consts::ARCH))
    }
}

/// The filters a helper runs under: the refused calls and `clone` with a namespace flag (EPERM),
/// and `clone3` (ENOSYS).
pub fn filters() -> Result<Vec<BpfProgram>, String> {
    let arch = target()?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = refused_calls().into_iter().map(|call| (call, vec![])).collect();
    let namespace_flags = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)
                .and_then(|condition| SeccompRule::new(vec![condition]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("the rule on clone's flags: {error}"))?;
    refused.insert(libc::SYS_clone, namespace_flags);
    let eperm = SeccompFilter::new(refused, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch);
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    );
    [eperm, enosys].into_iter().map(|filter| filter.and_then(BpfProgram::try_from).map_err(|e| e.to_string())).collect()
}

/// For a program that runs the driver inside itself (a test or benchmark binary, whose
/// `/proc/self/exe` is then what starts helpers): when this process was started as the launcher
/// (`PROGRAM confine-helper -- ...`), runs it and exits (127 when the helper could not be
/// started); otherwise returns. Call first thing in `main`.
pub fn launch_if_asked() {
    if std::env::args_os().nth(1).is_some_and(|first| first == CONFINE_HELPER) {
        let failed = main(std::env::args_os().skip(1));
        std::process::exit(if failed == ExitCode::SUCCESS { 0 } else { 127 });
    }
}

/// How often executing a helper whose file is open for writing (ETXTBSY) is tried again: as
/// `helper_run` does for its own start, since a fork of the driver may still hold the file.
const BUSY_RETRIES: u32 = 12;

/// The launcher: `args` are `confine-helper -- PROGRAM ARGUMENTS...` (after the program's own
/// name). Installs the filters and executes PROGRAM; returns only when that fails, with exit
/// code 127 and the reason on standard error.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let mut args = args.into_iter();
    let usage = || {
        eprintln!("usage: sharedresource-csi-driver {CONFINE_HELPER} -- PROGRAM [ARGUMENTS...]");
        ExitCode::from(2)
    };
    if args.next().is_none_or(|first| first != CONFINE_HELPER) || args.next().is_none_or(|dash| dash != "--") {
        return usage();
    }
    let Some(program) = args.next() else { return usage() };
    let arguments: Vec<OsString> = args.collect();
    let installed = filters().and_then(|filters| {
        filters.iter().try_for_each(|filter| seccompiler::apply_filter(filter).map_err(|e| e.to_string()))
    });
    if let Err(error) = installed {
        eprintln!("{CONFINE_HELPER}: the helper's seccomp filter could not be installed: {error}");
        return ExitCode::from(127);
    }
    let mut tries = 0;
    loop {
        // Returns only on failure: on success this process is the helper.
        let error = std::process::Command::new(&program).args(&arguments).exec();
        if error.raw_os_error() == Some(libc::ETXTBSY) && tries < BUSY_RETRIES {
            tries += 1;
            std::thread::sleep(Duration::from_millis(20 * u64::from(tries)));
            continue;
        }
        eprintln!("{CONFINE_HELPER}: {} could not be started: {error}", crate::quote::quote_path(Path::new(&program)));
        return ExitCode::from(127);
    }
}
