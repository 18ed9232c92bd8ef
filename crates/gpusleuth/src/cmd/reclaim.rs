// PLACEHOLDER: replaced by the module's owner before this lands.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("'reclaim' is not built yet")
}
