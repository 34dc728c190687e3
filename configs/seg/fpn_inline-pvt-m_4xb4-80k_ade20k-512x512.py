# Semantic FPN, InLine-PVT-M, ADE20K 512x512, 80k (recipe as InLine-PVT-T).
_base_ = './fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py'

checkpoint = 'checkpoints/inline_pvt_m.pth'
model = dict(backbone=dict(arch='medium', drop_path_rate=0.2,
                           init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
