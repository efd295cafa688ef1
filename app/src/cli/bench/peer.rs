//! The PyTorch peer: `scripts/peer_pytorch.py` and the GPT model it imports, built into the
//! binary, written to a temporary directory and run with `python3` (or `$LOCKSTEP_PYTHON`). It
//! prints a `Results` JSON object.
//! A missing Python or PyTorch is not our failure: it yields a one-line note instead of numbers.

use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::plan::Plan;
use super::report::Results;

const SCRIPT: &str = include_str!("../../../../scripts/peer_pytorch.py");
const GPT_MODEL: &str = include_str!("../../../../scripts/gpt_model.py");

/// The script's exit code when `import torch` fails.
const NO_TORCH: i32 = 3;

/// The script's directory; deleted when dropped, whatever happened.
struct TempScript(PathBuf);

impl TempScript {
    fn write() -> std::io::Result<TempScript> {
        let dir = std::env::temp_dir().join(format!("lockstep-peer-pytorch-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let script = TempScript(dir);
        std::fs::write(script.0.join("gpt_model.py"), GPT_MODEL)?;
        std::fs::write(script.path(), SCRIPT)?;
        Ok(script)
    }
    fn path(&self) -> PathBuf {
        self.0.join("peer_pytorch.py")
    }
}

impl Drop for TempScript {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// PyTorch's name for our device: `cpu` for every CPU device, `cuda:N` as is; None for others.
fn torch_device(location: &str) -> Option<String> {
    match location.split_once(':').map_or(location, |(kind, _)| kind) {
        "cpu" => Some("cpu".into()),
        "cuda" => Some(location.into()),
        _ => None,
    }
}

/// The peer's numbers, or a one-line reason why there are none.
pub fn pytorch(plan: &Plan) -> Result<Results, String> {
    let device = torch_device(&plan.device).ok_or_else(|| format!("PyTorch has no device like {}", plan.device))?;
    let plan = Plan { device, ..plan.clone() };
    let python = std::env::var("LOCKSTEP_PYTHON").unwrap_or_else(|_| "python3".into());
    let plan_json = serde_json::to_string(&plan).map_err(|e| format!("cannot encode the plan for PyTorch: {e}"))?;
    let script = TempScript::write().map_err(|e| {
        format!(
            "cannot write the PyTorch script to {}: {e}",
            std::env::temp_dir().display()
        )
    })?;
    let threads = plan.threads.to_string();
    let output = Command::new(&python)
        .arg(script.path())
        .arg(plan_json)
        // Sizes the OpenMP/MKL pools before torch starts them, as torch.set_num_threads does later.
        .env("OMP_NUM_THREADS", &threads)
        .env("MKL_NUM_THREADS", &threads)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => {
                format!("`{python}` is not installed or not on PATH (set LOCKSTEP_PYTHON to another interpreter)")
            }
            _ => format!("cannot start `{python}`: {e}"),
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last_err = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim();
    match output.status.code() {
        Some(0) => {}
        Some(NO_TORCH) => return Err(format!("PyTorch is not usable from `{python}`: {last_err}")),
        code => {
            return Err(format!(
                "the PyTorch peer failed (exit {}): {last_err}",
                code.map_or("by signal".into(), |c| c.to_string())
            ));
        }
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    serde_json::from_str(last).map_err(|e| format!("the PyTorch peer printed no readable result ({e})"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn devices_map_to_torch_names() {
        assert_eq!(super::torch_device("cpu:3").as_deref(), Some("cpu"));
        assert_eq!(super::torch_device("cuda:1").as_deref(), Some("cuda:1"));
        assert_eq!(super::torch_device("wgpu:0"), None);
    }
}
