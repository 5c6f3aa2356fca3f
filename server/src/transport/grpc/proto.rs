//! The types and the server and client generated from `proto/translate.proto`.

tonic::include_proto!("nmt.v1");
