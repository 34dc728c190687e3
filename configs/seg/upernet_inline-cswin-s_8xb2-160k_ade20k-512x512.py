# UperNet, InLine-CSwin-S, ADE20K 512x512, 160k (recipe as InLine-CSwin-T).
_base_ = './upernet_inline-cswin-t_8xb2-160k_ade20k-512x512.py'

checkpoint = 'checkpoints/inline_cswin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.4,
                           init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
