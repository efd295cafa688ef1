//! `--screenshot-after SECONDS PATH`: the window saves what it shows through eframe's own
//! screenshot command, then closes (docs and CI use it).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the window has to do for a screenshot, and how far it got.
pub struct Screenshot {
    at: Instant,
    path: PathBuf,
    requested: bool,
    image: Arc<Mutex<Option<Arc<egui::ColorImage>>>>,
}

impl Screenshot {
    pub fn after(delay: Duration, path: PathBuf) -> Screenshot {
        Screenshot {
            at: Instant::now() + delay,
            path,
            requested: false,
            image: Arc::default(),
        }
    }

    /// Called every frame: requests the picture when due, saves it when it arrives. Returns
    /// true once saved (the window may close).
    pub fn tick(&mut self, ctx: &egui::Context) -> anyhow::Result<bool> {
        if !self.requested {
            if Instant::now() >= self.at {
                let slot = self.image.clone();
                ctx.request_screenshot(move |image| {
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(image);
                });
                self.requested = true;
            }
            return Ok(false);
        }
        let Some(image) = self.image.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(false);
        };
        save_png(&image, &self.path)?;
        println!("saved a screenshot of the dashboard to {}", self.path.display());
        Ok(true)
    }
}

fn save_png(image: &egui::ColorImage, path: &std::path::Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let [w, h] = image.size;
    let rgba: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    image::save_buffer(path, &rgba, w as u32, h as u32, image::ExtendedColorType::Rgba8)
        .map_err(|e| anyhow::anyhow!("cannot write the screenshot {}: {e}", path.display()))
}
