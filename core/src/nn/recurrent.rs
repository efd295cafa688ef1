//! Recurrent layers with PyTorch's equations, parameter names and shapes: `Rnn` (tanh), `Gru`
//! and `Lstm`, several layers, `batch_first`, an initial state in and the final state out.
//! Composed from tensor ops (two products per step, then elementwise gates), so they run and
//! differentiate on every backend. Each layer's input products for all time steps are one GEMM.

use super::init;
use super::module::{Module, join_name, remap, remap_opt};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Which cell: its gate count and equations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellKind {
    /// h' = tanh(W_ih x + b_ih + W_hh h + b_hh)
    RnnTanh,
    /// Gates (r, z, n); n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)); h' = (1 − z) ⊙ n + z ⊙ h.
    Gru,
    /// Gates (i, f, g, o); c' = f ⊙ c + i ⊙ g; h' = o ⊙ tanh(c').
    Lstm,
}

impl CellKind {
    fn gates(self) -> usize {
        match self {
            CellKind::RnnTanh => 1,
            CellKind::Gru => 3,
            CellKind::Lstm => 4,
        }
    }
    fn name(self) -> &'static str {
        match self {
            CellKind::RnnTanh => "RNN",
            CellKind::Gru => "GRU",
            CellKind::Lstm => "LSTM",
        }
    }
}

/// Sizes and options of a recurrent stack, the arguments of `nn.RNN`/`nn.GRU`/`nn.LSTM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentConfig {
    /// Features per time step of the input (its last axis).
    pub input_size: usize,
    /// Features of the hidden state (and an LSTM's cell state), and of each output step.
    pub hidden_size: usize,
    /// Stacked layers; layer `k > 0` reads layer `k - 1`'s outputs (default 1).
    pub num_layers: usize,
    /// Whether each layer has `bias_ih` and `bias_hh` (default true).
    pub bias: bool,
    /// Inputs and outputs are [batch, time, features] instead of [time, batch, features].
    pub batch_first: bool,
}

impl RecurrentConfig {
    /// `input_size` to `hidden_size` with one layer, biases and `[time, batch, features]` inputs (PyTorch's defaults).
    pub fn new(input_size: usize, hidden_size: usize) -> RecurrentConfig {
        RecurrentConfig {
            input_size,
            hidden_size,
            num_layers: 1,
            bias: true,
            batch_first: false,
        }
    }
    /// Stacks `n` layers, as `num_layers=n`.
    pub fn num_layers(mut self, n: usize) -> RecurrentConfig {
        self.num_layers = n;
        self
    }
    /// With or without the `bias_ih`/`bias_hh` vectors, as `bias=...`.
    pub fn bias(mut self, bias: bool) -> RecurrentConfig {
        self.bias = bias;
        self
    }
    /// Takes and returns `[batch, time, features]` when true, as `batch_first=True`.
    pub fn batch_first(mut self, batch_first: bool) -> RecurrentConfig {
        self.batch_first = batch_first;
        self
    }
}

/// One layer's parameters: `weight_ih` [G·H, in], `weight_hh` [G·H, H], biases [G·H].
pub struct RecurrentLayer {
    /// `[G·H, in]`, the gates stacked in PyTorch's order; `in` is `input_size` for layer 0, `hidden_size` above.
    pub weight_ih: Tensor,
    /// `[G·H, H]`, applied to the previous step's hidden state.
    pub weight_hh: Tensor,
    /// `[G·H]`, added to the input product; `None` without bias.
    pub bias_ih: Option<Tensor>,
    /// `[G·H]`, added to the hidden-state product; `None` without bias.
    pub bias_hh: Option<Tensor>,
}

/// The state between steps: h (and c for an LSTM), each [num_layers, batch, hidden].
#[derive(Clone)]
pub struct RecurrentState {
    /// Each layer's hidden state, `[num_layers, batch, hidden]`.
    pub h: Tensor,
    /// Each layer's cell state for an LSTM, `[num_layers, batch, hidden]`; `None` for an RNN or a GRU.
    pub c: Option<Tensor>,
}

/// An RNN, GRU or LSTM stack (PyTorch's `nn.RNN`, `nn.GRU`, `nn.LSTM`).
pub struct Recurrent {
    /// The cell type: RNN (tanh), GRU or LSTM.
    pub kind: CellKind,
    /// Sizes and options the stack was built with.
    pub config: RecurrentConfig,
    /// Per-layer parameters, bottom layer first (PyTorch's `_l0`, `_l1`, … names).
    pub layers: Vec<RecurrentLayer>,
}

/// `nn.RNN(nonlinearity="tanh")`.
pub fn rnn(config: RecurrentConfig, device: &Device, generator: &Generator) -> Result<Recurrent> {
    Recurrent::new(CellKind::RnnTanh, config, device, generator)
}

/// `nn.GRU`.
pub fn gru(config: RecurrentConfig, device: &Device, generator: &Generator) -> Result<Recurrent> {
    Recurrent::new(CellKind::Gru, config, device, generator)
}

/// `nn.LSTM`.
pub fn lstm(config: RecurrentConfig, device: &Device, generator: &Generator) -> Result<Recurrent> {
    Recurrent::new(CellKind::Lstm, config, device, generator)
}

impl Recurrent {
    /// Every weight and bias uniform on ±1/sqrt(hidden), PyTorch's default, drawn layer by
    /// layer in PyTorch's order (weight_ih, weight_hh, bias_ih, bias_hh).
    pub fn new(kind: CellKind, config: RecurrentConfig, device: &Device, generator: &Generator) -> Result<Recurrent> {
        let RecurrentConfig {
            input_size,
            hidden_size: h,
            num_layers,
            ..
        } = config;
        if input_size == 0 || h == 0 || num_layers == 0 {
            return Err(Error::invalid(
                kind.name(),
                format!("input_size {input_size}, hidden_size {h} and num_layers {num_layers} must all be at least 1"),
            ));
        }
        let bound = 1.0 / (h as f64).sqrt();
        let rows = kind.gates() * h;
        let param = |shape: Vec<usize>| init::uniform_parameter(shape, bound, generator, device);
        let layers = (0..num_layers)
            .map(|k| {
                let inputs = if k == 0 { input_size } else { h };
                Ok(RecurrentLayer {
                    weight_ih: param(vec![rows, inputs])?,
                    weight_hh: param(vec![rows, h])?,
                    bias_ih: config.bias.then(|| param(vec![rows])).transpose()?,
                    bias_hh: config.bias.then(|| param(vec![rows])).transpose()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Recurrent { kind, config, layers })
    }

    /// The output sequence (every step's top-layer h) and the final state. `x` is [time, batch,
    /// input] ([batch, time, input] with `batch_first`); `state` defaults to zeros.
    pub fn forward_with_state(&self, x: &Tensor, state: Option<&RecurrentState>) -> Result<(Tensor, RecurrentState)> {
        let op = self.kind.name();
        let c = self.config;
        if x.rank() != 3 || x.dims()[2] != c.input_size {
            return Err(Error::invalid(
                op,
                format!(
                    "input must be [{}, {}, {}], got {}",
                    if c.batch_first { "batch" } else { "time" },
                    if c.batch_first { "time" } else { "batch" },
                    c.input_size,
                    x.shape()
                ),
            ));
        }
        let seq = if c.batch_first { x.transpose(0, 1)? } else { x.clone() };
        let (steps, batch) = (seq.dims()[0], seq.dims()[1]);
        let zeros = || Tensor::zeros([c.num_layers, batch, c.hidden_size], x.dtype(), x.device());
        let (h0, c0) = match state {
            Some(s) => {
                self.check_state(&s.h, batch)?;
                let c0 = match (self.kind, &s.c) {
                    (CellKind::Lstm, Some(c0)) => {
                        self.check_state(c0, batch)?;
                        Some(c0.clone())
                    }
                    (CellKind::Lstm, None) => Some(zeros()?),
                    _ => None,
                };
                (s.h.clone(), c0)
            }
            None => (zeros()?, (self.kind == CellKind::Lstm).then(zeros).transpose()?),
        };
        let mut input = seq;
        let (mut last_h, mut last_c) = (Vec::new(), Vec::new());
        for (k, layer) in self.layers.iter().enumerate() {
            let mut h = h0.narrow(0, k, 1)?.squeeze(0)?;
            let mut cell = c0.as_ref().map(|c| c.narrow(0, k, 1)?.squeeze(0)).transpose()?;
            // Every step's input product at once: [time * batch, in] x [in, G*H].
            let width = input.dims()[2];
            let flat = input.contiguous()?.reshape([steps * batch, width])?;
            let mut projected = flat.matmul(&layer.weight_ih.t()?)?;
            if let Some(b) = &layer.bias_ih {
                projected = projected.add(b)?;
            }
            let projected = projected.reshape([steps, batch, self.kind.gates() * c.hidden_size])?;
            let weight_hh = layer.weight_hh.t()?;
            let mut outputs = Vec::with_capacity(steps);
            for t in 0..steps {
                let xw = projected.narrow(0, t, 1)?.squeeze(0)?;
                let mut hw = h.matmul(&weight_hh)?;
                if let Some(b) = &layer.bias_hh {
                    hw = hw.add(b)?;
                }
                (h, cell) = self.cell(&xw, &hw, &h, cell.as_ref())?;
                outputs.push(h.unsqueeze(0)?);
            }
            let refs: Vec<&Tensor> = outputs.iter().collect();
            input = Tensor::concat(&refs, 0)?;
            last_h.push(h.unsqueeze(0)?);
            if let Some(cell) = cell {
                last_c.push(cell.unsqueeze(0)?);
            }
        }
        let output = if c.batch_first { input.transpose(0, 1)? } else { input };
        let stack = |parts: &[Tensor]| Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0);
        let state = RecurrentState {
            h: stack(&last_h)?,
            c: (!last_c.is_empty()).then(|| stack(&last_c)).transpose()?,
        };
        Ok((output, state))
    }

    /// One step: `xw` and `hw` are the input's and the state's products with their biases.
    fn cell(&self, xw: &Tensor, hw: &Tensor, h: &Tensor, c: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        let hs = self.config.hidden_size;
        let gate = |t: &Tensor, i: usize| t.narrow(-1, i * hs, hs);
        match self.kind {
            CellKind::RnnTanh => Ok((xw.add(hw)?.tanh()?, None)),
            CellKind::Gru => {
                let r = gate(xw, 0)?.add(&gate(hw, 0)?)?.sigmoid()?;
                let z = gate(xw, 1)?.add(&gate(hw, 1)?)?.sigmoid()?;
                let n = gate(xw, 2)?.add(&r.mul(&gate(hw, 2)?)?)?.tanh()?;
                // (1 − z) ⊙ n + z ⊙ h = n + z ⊙ (h − n)
                Ok((n.add(&z.mul(&h.sub(&n)?)?)?, None))
            }
            CellKind::Lstm => {
                let gates = xw.add(hw)?;
                let i = gate(&gates, 0)?.sigmoid()?;
                let f = gate(&gates, 1)?.sigmoid()?;
                let g = gate(&gates, 2)?.tanh()?;
                let o = gate(&gates, 3)?.sigmoid()?;
                let c = c.ok_or_else(|| Error::invalid("LSTM", "a cell state is needed"))?;
                let c_next = f.mul(c)?.add(&i.mul(&g)?)?;
                Ok((o.mul(&c_next.tanh()?)?, Some(c_next)))
            }
        }
    }

    fn check_state(&self, s: &Tensor, batch: usize) -> Result<()> {
        let want = [self.config.num_layers, batch, self.config.hidden_size];
        if s.dims() != want {
            return Err(Error::invalid(
                self.kind.name(),
                format!("the state must be {want:?} (layers, batch, hidden), got {}", s.shape()),
            ));
        }
        Ok(())
    }
}

impl Module for Recurrent {
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        for l in &mut self.layers {
            remap(&mut l.weight_ih, f)?;
            remap(&mut l.weight_hh, f)?;
            remap_opt(&mut l.bias_ih, f)?;
            remap_opt(&mut l.bias_hh, f)?;
        }
        Ok(())
    }
    /// The output sequence (the final state is `forward_with_state`'s).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with_state(x, None).map(|(out, _)| out)
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        for (k, l) in self.layers.iter().enumerate() {
            f(join_name(prefix, &format!("weight_ih_l{k}")), &l.weight_ih);
            f(join_name(prefix, &format!("weight_hh_l{k}")), &l.weight_hh);
            if let Some(b) = &l.bias_ih {
                f(join_name(prefix, &format!("bias_ih_l{k}")), b);
            }
            if let Some(b) = &l.bias_hh {
                f(join_name(prefix, &format!("bias_hh_l{k}")), b);
            }
        }
    }
    fn describe(&self) -> String {
        let c = self.config;
        format!(
            "{}({}, {}, num_layers={}, bias={}, batch_first={})",
            self.kind.name(),
            c.input_size,
            c.hidden_size,
            c.num_layers,
            if c.bias { "True" } else { "False" },
            if c.batch_first { "True" } else { "False" }
        )
    }
}
