//! The training pipeline on real data: corpus -> tokenizer -> a tiny model whose dev loss
//! falls, and a resumed run that continues where the first stopped.

use nmt_train::fixture::tiny_run_with;
use nmt_train::train::checkpoint;
use nmt_train::train::{train, TrainArgs};

#[test]
fn tiny_model_learns_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run_with(dir.path(), "transformer-tiny", 120).unwrap();
    let state = &run.report.state;
    println!(
        "tiny run: {} params, {} steps, {:.0} target tokens/s, dev nll {:?}",
        run.report.parameters, state.step, run.report.target_tokens_per_second, state.last_dev_loss
    );
    assert_eq!(state.step, 120);
    // A uniform guess over the vocabulary scores ln(600) = 6.4 nats per token.
    let dev = state.best_dev_loss.unwrap();
    assert!(dev < 5.0, "dev nll {dev}");

    // Resume for 30 more steps from run/last: same config, optimizer moments restored.
    let recorded: TrainArgs = serde_json::from_value(state.args.clone()).unwrap();
    let args = TrainArgs {
        resume: true,
        max_steps: Some(150),
        ..recorded
    };
    let resumed = train(&args).unwrap();
    assert_eq!(resumed.state.step, 150);
    assert!(resumed.state.target_tokens_seen > state.target_tokens_seen);
    let saved = checkpoint::load_state(&args.out.join("last")).unwrap();
    assert_eq!(saved.step, 150);
}
