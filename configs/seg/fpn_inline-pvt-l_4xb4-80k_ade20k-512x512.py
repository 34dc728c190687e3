# Semantic FPN, InLine-PVT-L, ADE20K 512x512, 80k (recipe as InLine-PVT-T).
_base_ = './fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py'

checkpoint = 'checkpoints/inline_pvt_l.pth'
model = dict(backbone=dict(arch='large', drop_path_rate=0.3,
                           init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
