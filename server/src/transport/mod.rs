//! The transports: the JSON API over axum ([`http`]) and the gRPC API over tonic ([`grpc`]),
//! both in front of the same service (`service::Infer`), and what they share: the connection
//! cap and timeouts ([`connections`]), the request id ([`request_id`]), and the answer each
//! gives for an error ([`error`]).

pub mod connections;
pub mod error;
pub mod grpc;
pub mod http;
pub mod request_id;
