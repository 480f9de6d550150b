"""euclip's hycoclip_objective against HyCoCLIP's own HyCoCLIP.forward (PalAvik/hycoclip 08bb05b), fp64.

HyCoCLIP.forward is called unbound on a stand-in object that holds its parameters (curv, logit_scale,
visual_alpha, textual_alpha) and whose encode_image/encode_text are MERU's: alpha * features, then
HyCoCLIP's own exp_map0. The inputs are raw features; euclip gets the same features through its
geometry's embed (alpha * f) and its similarity's exponential map.
"""
import sys
import tempfile
import types

import torch

# argv[1]: a checkout of PalAvik/hycoclip; argv[2] (optional): a folder holding loguru, which its lorentz.py imports.
sys.path[:0] = sys.argv[1:3]
# models.py imports its text encoder module (timm-free) for type hints; only lorentz and distributed run.
from hycoclip import lorentz as L  # noqa: E402
from hycoclip.models import HyCoCLIP  # noqa: E402

from euclip_cli.geometry import get_geometry  # noqa: E402
from euclip_cli.loss import hycoclip_objective  # noqa: E402

torch.set_default_dtype(torch.float64)
# HyCoCLIP gathers through torch.distributed even on one process.
torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mkdtemp() + "/store", rank=0, world_size=1)
worst = {"loss": 0.0, "grad": 0.0}
for seed in range(20):
    g = torch.Generator().manual_seed(seed)
    B, D = 16, 32
    feats = [torch.randn(B, D, generator=g) * s for s in (1.0, 0.8, 0.7, 0.4)]
    log_scale, log_curv = torch.tensor(2.0 + seed / 10), torch.tensor(0.1 * (seed % 5) - 0.2)
    log_alpha = (torch.tensor(-0.5 * torch.log(torch.tensor(float(D))).item()),) * 2

    def theirs(feats, log_scale, log_curv, a_img, a_txt):
        me = types.SimpleNamespace()
        me.curv, me.logit_scale = torch.nn.Parameter(log_curv.clone()), torch.nn.Parameter(log_scale.clone())
        me.visual_alpha, me.textual_alpha = torch.nn.Parameter(a_img.clone()), torch.nn.Parameter(a_txt.clone())
        me._curv_minmax = {"max": 2.302585, "min": -2.302585}  # MERU's ln 10 bounds
        me._rank, me.entail_weight, me.device = 0, 0.2, torch.device("cpu")
        me.encode_image = lambda x, project: L.exp_map0(me.visual_alpha.exp() * x, me.curv.exp())
        me.encode_text = lambda x, project: L.exp_map0(me.textual_alpha.exp() * x, me.curv.exp())
        out = HyCoCLIP.forward(me, *feats[:1], feats[2], feats[1], feats[3])
        return out["loss"], me

    ins = [f.clone().requires_grad_() for f in feats]
    loss_t, me = theirs(ins, log_scale, log_curv, log_alpha[0].clone(), log_alpha[1].clone())
    grads_t = torch.autograd.grad(loss_t, ins + [me.logit_scale, me.curv, me.visual_alpha, me.textual_alpha])

    ours = [f.clone().requires_grad_() for f in feats]
    t, c = log_scale.clone().requires_grad_(), log_curv.clone().requires_grad_()
    ai, at = log_alpha[0].clone().requires_grad_(), log_alpha[1].clone().requires_grad_()
    geo = get_geometry("hyperbolic", logit="d")
    image, text, box_image, box_text = (geo.embed(f, a) for f, a in zip(ours, (ai, at, ai, at)))
    loss_o = hycoclip_objective(geo, image, text, box_image, box_text, t.exp(), c.exp(), 0.2, 0.1)["loss"]
    grads_o = torch.autograd.grad(loss_o, ours + [t, c, ai, at])
    worst["loss"] = max(worst["loss"], abs(loss_o - loss_t).item())
    worst["grad"] = max(worst["grad"], max((a - b).abs().max().item() for a, b in zip(grads_o, grads_t)))
    print(f"seed {seed:2d}: HyCoCLIP {loss_t.item():.12f}  euclip {loss_o.item():.12f}")
print(f"largest difference over 20 seeds: loss {worst['loss']:.2e}, any gradient {worst['grad']:.2e} "
      f"(features, log scale, log curvature, both log alphas)")
