//! What a root process in a pod that mounts the driver's state directory read-only would try:
//! ask the running driver for a handover of its lazy volumes without being able to write the
//! state directory. Run by the deploy scenario inside such a pod (`chroot` into the host's root,
//! mounted read-only), it speaks the handover's words as a successor would, writes the proof
//! it is challenged for where it can (nowhere, read-only), claims it wrote it anyway, and prints
//! what the driver did: one `verdict:` line, `refused` when nothing followed its claim (the
//! connection closed, or the driver's refusal word) and `handed` when anything else did.
//!
//! Usage: `handover-ask STATE_DIR`.

use std::io::Read as _;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use sharedresource_csi_driver::volume::lazy::handover::SOCKET_FILE;
use sharedresource_csi_driver::volume::lazy::handover::{CHALLENGE_DIGITS, PROOF_PREFIX, PROVE, Word, say};

/// The most bytes read after the claim: a volume frame is far smaller than this, and an end is
/// all that is expected.
const READ_AT_MOST: u64 = 1 << 20;

fn main() -> ExitCode {
    let Some(state_dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: handover-ask STATE_DIR");
        return ExitCode::from(2);
    };
    match ask(&state_dir) {
        Ok(verdict) => {
            println!("verdict: {verdict}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            println!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn ask(state_dir: &std::path::Path) -> Result<&'static str, String> {
    let path = state_dir.join(SOCKET_FILE);
    let mut socket = UnixStream::connect(&path).map_err(|e| format!("connecting to {}: {e}", path.display()))?;
    println!("connected to {}", path.display());
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .and_then(|()| socket.set_write_timeout(Some(Duration::from_secs(30))))
        .map_err(|e| format!("setting timeouts: {e}"))?;
    say(&socket, Word::Ask).map_err(|e| e.to_string())?;
    let mut word = [0u8; 8];
    socket.read_exact(&mut word).map_err(|e| format!("reading the driver's first answer: {e}"))?;
    if &word != PROVE {
        println!("first answer: {:?}", String::from_utf8_lossy(&word));
        return Ok(if word.as_slice() == b"IGH1NOPE" { "refused" } else { "handed" });
    }
    let mut challenge = [0u8; CHALLENGE_DIGITS];
    socket.read_exact(&mut challenge).map_err(|e| format!("reading the challenge: {e}"))?;
    let proof = state_dir.join(format!("{PROOF_PREFIX}{}", String::from_utf8_lossy(&challenge)));
    match std::fs::File::create(&proof) {
        Ok(_) => println!("challenged; wrote the proof (the state directory is writable here)"),
        Err(error) => println!("challenged; could not write the proof: {error}"),
    }
    // Claimed whether or not it was written: the driver must look for itself.
    say(&socket, Word::Proved).map_err(|e| e.to_string())?;
    let mut after = Vec::new();
    let read = (&mut socket).take(READ_AT_MOST).read_to_end(&mut after);
    println!(
        "after the claim: {} bytes ({:?}), then {}",
        after.len(),
        String::from_utf8_lossy(&after[..after.len().min(8)]),
        match read {
            Ok(_) => "the connection closed".to_string(),
            Err(error) => format!("{error}"),
        }
    );
    Ok(if after.is_empty() || after.as_slice() == b"IGH1NOPE" { "refused" } else { "handed" })
}
