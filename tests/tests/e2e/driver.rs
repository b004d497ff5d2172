//! The driver on a real socket, spoken to as kubelet speaks to it: NodePublishVolume built from
//! stored pods, registration dialled by grpc-go, and csi-sanity's node and identity specs; and
//! its apiserver rate, as the apiserver sees it; and the startup taint, removed only once kubelet
//! lists the driver.

pub mod apiserver_rate;
pub mod csi_sanity;
pub mod kubelet_publish;
pub mod kubelet_registration;
pub mod startup_taint;
