//! The driver as a node runs it: a separate process (the test binary re-executed into the
//! driver's own command line, so it can be SIGKILLed), its sockets where kubelet looks, in
//! kubelet's plugin directories.

use std::path::{Path, PathBuf};

use crate::cluster::ChildProcess;

/// Set in the environment of the re-executed test binary: which of the driver's programs to be.
const DRIVER_CHILD_ENV: &str = "INLINE_GUARD_E2E_DRIVER";
/// [`DRIVER_CHILD_ENV`]'s value for the read-grants controller (any other: the node plugin).
const READ_GRANTS: &str = "read-grants";

/// Call first thing in a test binary's `main`: when this process is the driver child (the node
/// plugin, or the read-grants controller), runs it and exits. The driver child starts its
/// helpers through its own program (`/proc/self/exe confine-helper -- HELPER ...`, with an
/// emptied environment), which here is this test binary: it is the launcher too.
pub fn run_driver_if_child() {
    sharedresource_csi_driver::content::external::helper_confinement::launch_if_asked();
    let Some(program) = std::env::var_os(DRIVER_CHILD_ENV) else {
        return;
    };
    let code = if program == READ_GRANTS {
        let args = std::iter::once("sharedresource-read-grants".into()).chain(std::env::args_os().skip(1));
        sharedresource_csi_driver::controllers::program::main(args)
    } else {
        let args = std::iter::once("sharedresource-csi-driver".into()).chain(std::env::args_os().skip(1));
        sharedresource_csi_driver::cli::main(args)
    };
    std::process::exit(if code == std::process::ExitCode::SUCCESS { 0 } else { 2 });
}

/// Starts the read-grants controller as the identity in `kubeconfig`, logging to
/// `dir/read-grants.log`.
pub fn start_read_grants(kubeconfig: &Path, dir: &Path) -> Result<ChildProcess, String> {
    start_read_grants_as("read-grants", kubeconfig, dir, &[])
}

/// [`start_read_grants`] with `extra` arguments, logging to `dir/<name>.log`.
pub fn start_read_grants_as(name: &str, kubeconfig: &Path, dir: &Path, extra: &[&str]) -> Result<ChildProcess, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    // Its notices logged one by one: a scenario that counts them can say which were written.
    let env = [
        (DRIVER_CHILD_ENV, READ_GRANTS),
        ("RUST_LOG", "info,sharedresource_csi_driver::controllers::access_notices=debug"),
    ];
    ChildProcess::spawn(name, &exe, &args, &env, dir)
}

/// Where the driver of a node keeps what.
pub struct PluginFiles {
    /// Its configuration.
    pub config: PathBuf,
    /// Its CSI socket.
    pub socket: PathBuf,
    /// The static shares it serves.
    pub shares: PathBuf,
    /// Its records.
    pub state: PathBuf,
    /// The configuration as laid out, before any [`PluginFiles::configure`] addition.
    base_config: String,
}

impl PluginFiles {
    /// Lays out the driver of the node whose kubelet root is `kubelet_root`, keeping its own
    /// files in `dir`, serving the static shares of `dir/shares`; content is refreshed every
    /// second.
    pub fn new(dir: &Path, kubelet_root: &Path) -> Result<PluginFiles, String> {
        let shares = dir.join("shares");
        PluginFiles::with_source(
            dir,
            kubelet_root,
            &format!("staticSharesDir: {}\nrefreshSeconds: 1\n", shares.display()),
        )
    }

    /// Lays out a driver serving the cluster's shares as the identity in `kubeconfig`, with its
    /// periodic recheck every `refresh_seconds` and its health port on `health`; it reads pods
    /// for projections that show their labels (the suite applies `pod-metadata.yaml` too).
    pub fn kubernetes(
        dir: &Path,
        kubelet_root: &Path,
        kubeconfig: &Path,
        refresh_seconds: u64,
        health: std::net::SocketAddr,
    ) -> Result<PluginFiles, String> {
        let source = format!(
            "contentSource: kubernetes\nkubeconfig: {}\nrefreshSeconds: {refresh_seconds}\nhealthAddress: {health}\npodMetadata: true\n",
            kubeconfig.display()
        );
        PluginFiles::with_source(dir, kubelet_root, &source)
    }

    fn with_source(dir: &Path, kubelet_root: &Path, source: &str) -> Result<PluginFiles, String> {
        let state = dir.join("state");
        let base_config = format!(
            "stateDir: {}\nregistryDir: {}\nkubeletDir: {}\ntmpfsSize: 1Mi\nshutdownTimeoutSeconds: 2\n{source}",
            state.display(),
            kubelet_root.join("plugins_registry").display(),
            kubelet_root.display(),
        );
        let files = PluginFiles {
            config: dir.join("driver.yaml"),
            socket: kubelet_root.join("plugins/sharedresource.csi.inlineguard.dev/csi.sock"),
            shares: dir.join("shares"),
            state,
            base_config,
        };
        std::fs::create_dir_all(&files.shares).map_err(|e| format!("{}: {e}", files.shares.display()))?;
        files.configure("")?;
        Ok(files)
    }

    /// Writes the configuration: the laid-out one plus the YAML lines `extra` (keys it does not
    /// set already). The driver reads it when it starts.
    pub fn configure(&self, extra: &str) -> Result<(), String> {
        let text = format!("{}{extra}", self.base_config);
        std::fs::write(&self.config, text).map_err(|e| format!("{}: {e}", self.config.display()))
    }

    /// Starts the driver process, logging to `dir/NAME.log`.
    pub fn start(&self, dir: &Path, name: &str) -> Result<ChildProcess, String> {
        self.start_with(dir, name, &self.config)
    }

    /// Starts a second driver process beside the running one (its successor), logging to
    /// `dir/NAME.log`: the configuration as written, but its health port a free one of its own
    /// (two pods of the DaemonSet each have theirs; on this node they share the host's).
    pub fn start_beside(&self, dir: &Path, name: &str) -> Result<ChildProcess, String> {
        let text = std::fs::read_to_string(&self.config).map_err(|e| format!("{}: {e}", self.config.display()))?;
        let port = crate::cluster::free_port()?;
        let text: Vec<String> = text
            .lines()
            .map(|line| match line.starts_with("healthAddress:") {
                true => format!("healthAddress: 127.0.0.1:{port}"),
                false => line.to_string(),
            })
            .collect();
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(&config, text.join("\n") + "\n").map_err(|e| format!("{}: {e}", config.display()))?;
        self.start_with(dir, name, &config)
    }

    fn start_with(&self, dir: &Path, name: &str, config: &Path) -> Result<ChildProcess, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        ChildProcess::spawn(
            name,
            &exe,
            &[
                "--endpoint".into(),
                format!("unix://{}", self.socket.display()),
                "--node-id".into(),
                super::kubelet::NODE_NAME.into(),
                "--config".into(),
                config.display().to_string(),
            ],
            &[(DRIVER_CHILD_ENV, "1")],
            dir,
        )
    }
}
