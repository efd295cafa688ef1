//! `#[derive(Module)]`: writes a struct's `lockstep_core::nn::Module` impl from its fields, as
//! PyTorch's `nn.Module.__setattr__` registers them. Fields are visited in declaration order
//! under their names (PyTorch's dotted names):
//!
//! - a field of type `Tensor` is a parameter (`#[module(buffer)]`: a buffer);
//! - every other field is a child: a module, a `Box<dyn Module>`, a `Vec` of them (children
//!   `name.0`, `name.1`, … as a `ModuleList`) or an `Option` of one;
//! - `#[module(skip)]` leaves a field out (configuration, caches: it must hold no tensors);
//! - `#[module(rename = "c_attn")]` registers a field under another name;
//! - `#[module(training)]` on a `bool` field: `set_training` stores the mode there;
//! - `#[module(kind = "Sequential")]` on the struct: the class name `describe` prints.
//!
//! `forward` calls the struct's own inherent `fn forward(&self, x: &Tensor) -> Result<Tensor>`;
//! without one the impl does not compile ("function cannot return without recursing", pointing
//! at the struct: it would call itself). A model of several inputs says `#[module(inputs)]` on
//! the struct and writes `fn forward(&self, inputs: &[Tensor]) -> Result<Tensor>` instead:
//! `Module::forward_inputs` hands it the batch's inputs, and `Module::forward` its one. An error
//! of a layer inside names the layer's field (`fc1: Linear: shapes …`) when the model runs
//! through `Module` (the Trainer, a `Box<dyn Module>`, `Module::forward(&net, x)`).

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote, quote_spanned};
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Type, parse_macro_input};

#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What a field is to the module.
enum Role {
    Parameter,
    Buffer,
    Child,
    TrainingFlag,
    Skipped,
}

struct Field {
    ident: Ident,
    /// The registered name (the field's, or its `rename`).
    name: String,
    role: Role,
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "derive(Module) needs a struct with named fields",
        ));
    };
    let Fields::Named(named) = &data.fields else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "derive(Module) needs a struct with named fields (their names become the parameters' names)",
        ));
    };
    let fields = named.named.iter().map(field).collect::<syn::Result<Vec<_>>>()?;
    let (several_inputs, kind) = struct_options(input)?;
    let ty = &input.ident;
    let kind = kind.unwrap_or_else(|| ty.to_string());
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();

    let of = |role: fn(&Role) -> bool| fields.iter().filter(move |f| role(&f.role));
    let params: Vec<_> = of(|r| matches!(r, Role::Parameter)).collect();
    let buffers: Vec<_> = of(|r| matches!(r, Role::Buffer)).collect();
    let children: Vec<_> = of(|r| matches!(r, Role::Child)).collect();
    let flags: Vec<_> = of(|r| matches!(r, Role::TrainingFlag)).collect();

    let visit_own = |list: &[&Field]| {
        each(
            list,
            |ident, name| quote! { f(::std::format!("{}{}", prefix, #name), &self.#ident); },
        )
    };
    let visit_children = |method: Ident| {
        each(&children, |ident, name| {
            quote! { ::lockstep_core::__private::Child::#method(&self.#ident, &::std::format!("{}{}", prefix, #name), f); }
        })
    };
    let own_params = visit_own(&params);
    let own_buffers = visit_own(&buffers);
    let child_params = visit_children(format_ident!("visit_parameters"));
    let child_buffers = visit_children(format_ident!("visit_buffers"));
    let child_state = visit_children(format_ident!("visit_state"));
    let own_tensors = [params.as_slice(), buffers.as_slice()].concat();
    let map_own = each(
        &own_tensors,
        |ident, _| quote! { ::lockstep_core::__private::remap(&mut self.#ident, f)?; },
    );
    let map_children = each(&children, |ident, _| {
        quote! { ::lockstep_core::__private::Child::map_tensors(&mut self.#ident, f)?; }
    });
    let set_flags = each(&flags, |ident, _| quote! { self.#ident = training; });
    let train_children = each(&children, |ident, _| {
        quote! { ::lockstep_core::__private::Child::set_training(&mut self.#ident, training); }
    });
    let generator_children = each(&children, |ident, _| {
        quote! { ::lockstep_core::__private::Child::visit_generators(&self.#ident, f); }
    });
    let sync_children = each(&children, |ident, _| {
        quote! { ::lockstep_core::__private::Child::convert_sync_batchnorm(&mut self.#ident, comm); }
    });
    let describe_children = each(&children, |ident, name| {
        quote! {
            if let ::std::option::Option::Some(d) = ::lockstep_core::__private::Child::describe_child(&self.#ident) {
                children.push((#name.to_string(), d));
            }
        }
    });

    // Without an inherent `forward` this would call itself: refuse to compile instead. Spanned
    // at the struct's name, so the lint counts as the user's code (lints are silent inside
    // another crate's macro) and the error points at the struct.
    let forward = if several_inputs {
        quote_spanned! {ty.span()=>
            fn forward(&self, x: &::lockstep_core::Tensor) -> ::lockstep_core::Result<::lockstep_core::Tensor> {
                #ty::forward(self, ::std::slice::from_ref(x)).map_err(|e| ::lockstep_core::__private::name_failing_layer(self, e))
            }
            fn forward_inputs(
                &self,
                inputs: &[::lockstep_core::Tensor],
            ) -> ::lockstep_core::Result<::lockstep_core::Tensor> {
                #ty::forward(self, inputs).map_err(|e| ::lockstep_core::__private::name_failing_layer(self, e))
            }
        }
    } else {
        quote_spanned! {ty.span()=>
            #[deny(unconditional_recursion)]
            fn forward(&self, x: &::lockstep_core::Tensor) -> ::lockstep_core::Result<::lockstep_core::Tensor> {
                #ty::forward(self, x).map_err(|e| ::lockstep_core::__private::name_failing_layer(self, e))
            }
        }
    };
    Ok(quote! {
        impl #impl_generics ::lockstep_core::nn::Module for #ty #ty_generics #where_clause {
            #forward
            fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(::std::string::String, &::lockstep_core::Tensor)) {
                #own_params
                #child_params
            }
            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(::std::string::String, &::lockstep_core::Tensor)) {
                #own_buffers
                #child_buffers
            }
            fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(::std::string::String, &::lockstep_core::Tensor)) {
                #own_params
                #own_buffers
                #child_state
            }
            fn map_tensors(
                &mut self,
                f: &mut dyn FnMut(&::lockstep_core::Tensor) -> ::lockstep_core::Result<::lockstep_core::Tensor>,
            ) -> ::lockstep_core::Result<()> {
                #map_own
                #map_children
                Ok(())
            }
            fn set_training(&mut self, training: bool) {
                #set_flags
                #train_children
            }
            fn visit_generators(&self, f: &mut dyn FnMut(&::std::sync::Arc<::lockstep_core::Generator>)) {
                #generator_children
            }
            fn convert_sync_batchnorm(&mut self, comm: &::std::sync::Arc<dyn ::lockstep_core::backend::Communicator>) {
                #sync_children
            }
            fn describe(&self) -> ::std::string::String {
                let mut children: ::std::vec::Vec<(::std::string::String, ::std::string::String)> = ::std::vec::Vec::new();
                #describe_children
                ::lockstep_core::__private::describe_tree(#kind, &children)
            }
        }
    })
}

/// What the struct says in `#[module(...)]`: `inputs` (its forward takes `&[Tensor]`) and
/// `kind = "Sequential"` (the class name `describe` prints, when not the struct's own).
fn struct_options(input: &DeriveInput) -> syn::Result<(bool, Option<String>)> {
    let (mut several, mut kind) = (false, None);
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("inputs") {
                several = true;
                Ok(())
            } else if meta.path.is_ident("kind") {
                kind = Some(meta.value()?.parse::<LitStr>()?.value());
                Ok(())
            } else {
                Err(meta.error("on a struct, expected `inputs` (its forward takes `&[Tensor]`) or `kind = \"Name\"`"))
            }
        })?;
    }
    Ok((several, kind))
}

/// One statement per field of `list`, made from its identifier and registered name.
fn each(list: &[&Field], stmt: impl Fn(&Ident, &str) -> Tokens) -> Tokens {
    list.iter().map(|f| stmt(&f.ident, &f.name)).collect()
}

fn field(f: &syn::Field) -> syn::Result<Field> {
    let ident = f.ident.clone().expect("named fields have names");
    let mut name = ident.to_string();
    let mut role = if is_tensor(&f.ty) { Role::Parameter } else { Role::Child };
    for attr in f.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                role = Role::Skipped;
            } else if meta.path.is_ident("buffer") {
                role = Role::Buffer;
            } else if meta.path.is_ident("training") {
                role = Role::TrainingFlag;
            } else if meta.path.is_ident("rename") {
                name = meta.value()?.parse::<LitStr>()?.value();
            } else {
                return Err(meta.error("expected `skip`, `buffer`, `training` or `rename = \"name\"`"));
            }
            Ok(())
        })?;
    }
    if matches!(role, Role::Buffer) && !is_tensor(&f.ty) {
        return Err(syn::Error::new_spanned(
            &f.ty,
            "#[module(buffer)] goes on a `Tensor` field",
        ));
    }
    Ok(Field { ident, name, role })
}

/// Whether the field's type is written `Tensor` (any path ending in it).
fn is_tensor(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Tensor" && s.arguments.is_empty()))
}
