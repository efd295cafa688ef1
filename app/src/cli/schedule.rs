//! `lockstep schedule`: a pipeline schedule for P stages and M micro-batches, simulated without
//! devices: each stage's timeline, the bubble beside the textbook (P−1)/(M+P−1), and how many
//! micro-batches' activations each stage holds at once.

use lockstep_core::train::pipeline::{PassCosts, Schedule};
pub use lockstep_flags::schedule::Args;

pub fn run(args: Args) -> anyhow::Result<()> {
    let schedule = Schedule::new(args.schedule, args.stages, args.micro_batches)?;
    let costs = PassCosts {
        forward: 1.0,
        backward: f64::from(args.backward_cost.max(1)),
    };
    let timeline = schedule.simulate(costs)?;
    let (p, m) = (args.stages as f64, args.micro_batches as f64);
    println!(
        "{} schedule, {} stages, {} micro-batches (a forward takes one column, a backward {})\n",
        args.schedule.name(),
        args.stages,
        args.micro_batches,
        args.backward_cost.max(1)
    );
    print!("{}", timeline.render(1.0));
    println!(
        "\nbubble: {:.1}% of stage time idle (theory (P-1)/(M+P-1) = {:.1}%)",
        100.0 * timeline.bubble_fraction(),
        100.0 * (p - 1.0) / (m + p - 1.0)
    );
    let peaks: Vec<String> = schedule.peak_activations().iter().map(usize::to_string).collect();
    println!(
        "micro-batches of activations held at once, by stage: {}",
        peaks.join(", ")
    );
    Ok(())
}
