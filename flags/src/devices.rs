//! `lockstep devices`'s flags.

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also print each device's vendor, driver, features and limits.
    #[arg(long)]
    pub details: bool,
}
