//! A small builder for ONNX graphs: values are names (`String`), each op call appends one
//! node and returns its output's name. Node and value names carry a scope
//! (`decoder.layers.1.cross_attn`) so a graph reads like the model it came from.

use crate::proto::{
    attribute_type, data_location, data_type, AttributeProto, Dimension, FunctionProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto,
    TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto, IR_VERSION, OPSET,
};

use model_package::names;

/// A graph input/output axis: symbolic (`"batch"`) or fixed.
#[derive(Clone, Debug)]
pub enum Axis {
    Named(String),
    Fixed(usize),
}

impl From<&str> for Axis {
    fn from(name: &str) -> Self {
        Axis::Named(name.to_string())
    }
}
impl From<usize> for Axis {
    fn from(n: usize) -> Self {
        Axis::Fixed(n)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    F32,
    I32,
    I64,
}

impl ElemType {
    fn code(self) -> i32 {
        match self {
            ElemType::F32 => data_type::FLOAT,
            ElemType::I32 => data_type::INT32,
            ElemType::I64 => data_type::INT64,
        }
    }
}

pub fn attr_int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: value,
        r#type: attribute_type::INT,
        ..Default::default()
    }
}

pub fn attr_ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: values.to_vec(),
        r#type: attribute_type::INTS,
        ..Default::default()
    }
}

pub fn attr_string(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: value.as_bytes().to_vec(),
        r#type: attribute_type::STRING,
        ..Default::default()
    }
}

pub fn attr_float(name: &str, value: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f: value,
        r#type: attribute_type::FLOAT,
        ..Default::default()
    }
}

fn value_info(name: &str, elem: ElemType, axes: &[Axis]) -> ValueInfoProto {
    let dim = axes
        .iter()
        .map(|a| match a {
            Axis::Named(n) => Dimension {
                dim_value: None,
                dim_param: Some(n.clone()),
            },
            Axis::Fixed(n) => Dimension {
                dim_value: Some(*n as i64),
                dim_param: None,
            },
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem.code(),
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

#[derive(Default)]
pub struct Graph {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    scope: Vec<String>,
    counter: usize,
    /// The bodies of the fused operators the graph uses, one per operator.
    functions: Vec<FunctionProto>,
}

/// A node of a fused operator's body: `(op_type, inputs, outputs, attributes)`.
pub type BodyNode = (
    &'static str,
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<AttributeProto>,
);

/// A fused operator of [`model_package::names::FUSED_DOMAIN`]: its name and the body of
/// standard operators that defines it, over the formal `inputs` and `outputs`.
pub struct Fused {
    pub op_type: &'static str,
    pub doc: &'static str,
    pub inputs: &'static [&'static str],
    pub outputs: &'static [&'static str],
    /// `(op_type, inputs, outputs, attributes)` in order, over the formal names.
    pub body: Vec<BodyNode>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with `name` appended to the naming scope.
    pub fn scoped<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> T) -> T {
        self.scope.push(name.to_string());
        let out = f(self);
        self.scope.pop();
        out
    }

    pub fn fresh(&mut self, hint: &str) -> String {
        self.counter += 1;
        let mut name = self.scope.join(".");
        if !name.is_empty() {
            name.push('.');
        }
        format!("{name}{hint}_{}", self.counter)
    }

    pub fn input(&mut self, name: &str, elem: ElemType, axes: &[Axis]) -> String {
        self.inputs.push(value_info(name, elem, axes));
        name.to_string()
    }

    /// Exposes `value` as graph output `name` (through an `Identity` when the names differ).
    pub fn output(&mut self, value: &str, name: &str, elem: ElemType, axes: &[Axis]) {
        if value != name {
            self.nodes.push(NodeProto {
                input: vec![value.into()],
                output: vec![name.into()],
                name: format!("{name}.identity"),
                op_type: "Identity".into(),
                ..Default::default()
            });
        }
        self.outputs.push(value_info(name, elem, axes));
    }

    /// A float initializer (weights, constants).
    pub fn weight(&mut self, hint: &str, dims: &[usize], values: &[f32]) -> String {
        assert_eq!(
            dims.iter().product::<usize>(),
            values.len(),
            "{hint}: shape/data mismatch"
        );
        let name = self.fresh(hint);
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: data_type::FLOAT,
            name: name.clone(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..Default::default()
        });
        name
    }

    /// A float initializer named `name` whose values stay in another file: `length` bytes at
    /// byte `offset` of `location` (relative to the model file), little-endian.
    pub fn external_weight(
        &mut self,
        name: &str,
        dims: &[usize],
        location: &str,
        offset: u64,
        length: u64,
    ) -> String {
        assert_eq!(
            dims.iter().product::<usize>() as u64 * 4,
            length,
            "{name}: shape/length mismatch"
        );
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
        };
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: data_type::FLOAT,
            name: name.into(),
            external_data: vec![
                entry("location", location.into()),
                entry("offset", offset.to_string()),
                entry("length", length.to_string()),
            ],
            data_location: data_location::EXTERNAL,
            ..Default::default()
        });
        name.into()
    }

    /// A 1-D int64 constant (shapes, axes, indices); `scalar` makes it 0-D.
    pub fn ints(&mut self, values: &[i64]) -> String {
        self.int_tensor(values, false)
    }

    pub fn int_scalar(&mut self, value: i64) -> String {
        self.int_tensor(&[value], true)
    }

    fn int_tensor(&mut self, values: &[i64], scalar: bool) -> String {
        let name = self.fresh("const");
        self.initializers.push(TensorProto {
            dims: if scalar {
                vec![]
            } else {
                vec![values.len() as i64]
            },
            data_type: data_type::INT64,
            name: name.clone(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..Default::default()
        });
        name
    }

    pub fn float_scalar(&mut self, value: f32) -> String {
        let name = self.fresh("const");
        self.initializers.push(TensorProto {
            dims: vec![],
            data_type: data_type::FLOAT,
            name: name.clone(),
            raw_data: value.to_le_bytes().to_vec(),
            ..Default::default()
        });
        name
    }

    /// Appends one node with a single output and returns that output's name.
    pub fn op(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attributes: Vec<AttributeProto>,
    ) -> String {
        let output = self.fresh(&op_type.to_lowercase());
        self.op_into(op_type, inputs, attributes, &output);
        output
    }

    /// Like [`Graph::op`] with a chosen output name (contract names such as `present.*`).
    pub fn op_into(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attributes: Vec<AttributeProto>,
        output: &str,
    ) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_string()],
            name: format!("{output}.node"),
            op_type: op_type.into(),
            attribute: attributes,
            domain: String::new(),
        });
    }

    /// Appends a node of the fused operator `op` (declaring its function the first time) and
    /// returns its output's name.
    pub fn fused(&mut self, op: Fused, inputs: &[&str]) -> String {
        assert_eq!(
            inputs.len(),
            op.inputs.len(),
            "{} takes {:?}",
            op.op_type,
            op.inputs
        );
        let output = self.fresh(&op.op_type.to_lowercase());
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.clone()],
            name: format!("{output}.node"),
            op_type: op.op_type.into(),
            attribute: vec![],
            domain: names::FUSED_DOMAIN.into(),
        });
        if !self.functions.iter().any(|f| f.name == op.op_type) {
            let node = op
                .body
                .into_iter()
                .map(|(op_type, inputs, outputs, attribute)| NodeProto {
                    input: inputs.into_iter().map(String::from).collect(),
                    name: outputs[0].into(),
                    output: outputs.into_iter().map(String::from).collect(),
                    op_type: op_type.into(),
                    attribute,
                    domain: String::new(),
                })
                .collect();
            self.functions.push(FunctionProto {
                name: op.op_type.into(),
                input: op.inputs.iter().map(|s| s.to_string()).collect(),
                output: op.outputs.iter().map(|s| s.to_string()).collect(),
                node,
                doc_string: op.doc.into(),
                opset_import: vec![OperatorSetIdProto {
                    domain: String::new(),
                    version: OPSET,
                }],
                domain: names::FUSED_DOMAIN.into(),
            });
        }
        output
    }

    /// Appends one node with `outputs` outputs (ONNX's `GRU`/`LSTM` give the sequence and
    /// the final states) and returns their names. An empty input name is an omitted
    /// optional input.
    pub fn op_outputs(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attributes: Vec<AttributeProto>,
        outputs: usize,
    ) -> Vec<String> {
        let names: Vec<String> = (0..outputs)
            .map(|i| self.fresh(&format!("{}_out{i}", op_type.to_lowercase())))
            .collect();
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: names.clone(),
            name: format!("{}.node", names[0]),
            op_type: op_type.into(),
            attribute: attributes,
            domain: String::new(),
        });
        names
    }

    /// `x[.., start..end]` on `axis`.
    pub fn slice(&mut self, x: &str, axis: i64, start: i64, end: i64) -> String {
        let starts = self.ints(&[start]);
        let ends = self.ints(&[end]);
        let axes = self.ints(&[axis]);
        self.op("Slice", &[x, &starts, &ends, &axes], vec![])
    }

    pub fn add(&mut self, a: &str, b: &str) -> String {
        self.op("Add", &[a, b], vec![])
    }
    pub fn sub(&mut self, a: &str, b: &str) -> String {
        self.op("Sub", &[a, b], vec![])
    }
    pub fn mul(&mut self, a: &str, b: &str) -> String {
        self.op("Mul", &[a, b], vec![])
    }
    pub fn matmul(&mut self, a: &str, b: &str) -> String {
        self.op("MatMul", &[a, b], vec![])
    }
    pub fn transpose(&mut self, x: &str, perm: &[i64]) -> String {
        self.op("Transpose", &[x], vec![attr_ints("perm", perm)])
    }
    /// `shape` may use 0 (copy the input's dim) and -1 (infer).
    pub fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let shape = self.ints(shape);
        self.op("Reshape", &[x, &shape], vec![])
    }
    pub fn unsqueeze(&mut self, x: &str, axes: &[i64]) -> String {
        let axes = self.ints(axes);
        self.op("Unsqueeze", &[x, &axes], vec![])
    }
    pub fn squeeze(&mut self, x: &str, axes: &[i64]) -> String {
        let axes = self.ints(axes);
        self.op("Squeeze", &[x, &axes], vec![])
    }
    pub fn concat(&mut self, xs: &[&str], axis: i64) -> String {
        self.op("Concat", xs, vec![attr_int("axis", axis)])
    }
    pub fn gather(&mut self, data: &str, indices: &str, axis: i64) -> String {
        self.op("Gather", &[data, indices], vec![attr_int("axis", axis)])
    }
    pub fn softmax_last(&mut self, x: &str) -> String {
        self.op("Softmax", &[x], vec![attr_int("axis", -1)])
    }
    pub fn cast(&mut self, x: &str, to: ElemType) -> String {
        self.op("Cast", &[x], vec![attr_int("to", to.code() as i64)])
    }
    pub fn layer_norm(&mut self, x: &str, weight: &str, bias: &str, eps: f64) -> String {
        self.op(
            "LayerNormalization",
            &[x, weight, bias],
            vec![attr_int("axis", -1), attr_float("epsilon", eps as f32)],
        )
    }

    pub fn finish(self, name: &str, doc: &str) -> ModelProto {
        ModelProto {
            ir_version: IR_VERSION,
            producer_name: "nmt-export".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            doc_string: doc.into(),
            graph: Some(GraphProto {
                node: self.nodes,
                name: name.into(),
                initializer: self.initializers,
                doc_string: doc.into(),
                input: self.inputs,
                output: self.outputs,
            }),
            opset_import: std::iter::once(OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            })
            .chain((!self.functions.is_empty()).then(|| OperatorSetIdProto {
                domain: names::FUSED_DOMAIN.into(),
                version: names::FUSED_DOMAIN_VERSION,
            }))
            .collect(),
            metadata_props: vec![StringStringEntryProto {
                key: "contract".into(),
                value: "model_package::names".into(),
            }],
            functions: self.functions,
        }
    }
}
