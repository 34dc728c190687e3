# UperNet, InLine-Swin-S, ADE20K 512x512, 160k (recipe as InLine-Swin-T).
_base_ = './upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py'

checkpoint = 'checkpoints/inline_swin_s.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
