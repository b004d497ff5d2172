//! A content source whose every volume is a lazy volume of one `exec` provider, for tests and
//! benchmarks of the lazy path through whole drivers (feature `test-util`): no cluster and no
//! access check; the helpers run on a runtime of their own, as the Kubernetes source runs them.

use std::sync::Arc;

use crate::content::ask::VolumeAsk;
use crate::content::error::Result;
use crate::content::external::exec::ExecProviders;
use crate::content::lazy::{HandedFiles, LazyFiles};
use crate::content::payload::Payload;
use crate::content::{ContentSource, Opened, Opening, Shown};

/// Every volume a lazy volume of `provider` when `providers` has it; otherwise an empty eager
/// volume (a driver configured without it cannot take that provider's volumes over).
pub struct LazyOnlySource {
    /// The node's `exec` providers.
    pub providers: ExecProviders,
    /// The one every volume is of.
    pub provider: String,
    /// Where the helpers run.
    pub runtime: tokio::runtime::Handle,
}

impl ContentSource for LazyOnlySource {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, opening: Opening) -> Result<Opened> {
        let provider = self.providers.get(&self.provider).filter(|_| opening == Opening::Publish);
        let Some(provider) = provider else {
            return Ok(Opened::files(Payload::new()));
        };
        let files = self.runtime.block_on(self.providers.lazy_files(provider, ask))?;
        Ok(Opened { shown: Shown::Lazy(Arc::new(files)), versions: Default::default(), absent: Vec::new() })
    }

    fn lazy_handed(&self, handed: HandedFiles) -> Result<Arc<dyn LazyFiles>> {
        let _entered = self.runtime.enter();
        Ok(Arc::new(self.providers.lazy_handed(handed)?))
    }
}
