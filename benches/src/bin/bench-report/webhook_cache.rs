//! The webhook's cache: the memory its label stores take with many namespaces and CSIDrivers,
//! beside kube's reflector store holding the same objects whole.

use std::fmt::Write as _;

use crate::results::{Results, number};

/// Writes the cache section, or says it was not measured.
pub fn write(w: &mut String, results: &Results) {
    let _ = writeln!(w, "## The webhook's cache\n");
    let Some(cache) = &results.cache else {
        let _ = writeln!(w, "Not measured in this run.");
        return;
    };
    let _ = writeln!(
        w,
        "{} namespaces with five labels, an annotation and two managed-field entries each, applied as watch \
         events: the server's label store grows the resident set by {:.1} MB (target: a few MB); the same \
         objects kept whole in kube's reflector store, by {:.1} MB.",
        cache["namespaces"],
        number(&cache["label_store_mb"]),
        number(&cache["reflector_store_mb"])
    );
    let _ = writeln!(
        w,
        "\nWith {} labelled CSIDrivers beside them (the webhook watches both, per replica, not per node): \
         {:.1} MB in all.",
        cache["csi_drivers"],
        number(&cache["with_drivers_mb"])
    );
}
