/*
 * trident_trees.h: the codes of argument trees, state trees and output recipes, as the
 * runtime reads them (Note [Argument trees] in trees.cpp) and as Python writes them:
 * ir/trees.py and lower/state/tree.py take these values from `runtime.ABI`, which reads them
 * from this header (every enumerator is written `TRT_X = N` for that), so they are defined here
 * alone.
 */
#ifndef TRIDENT_TREES_H
#define TRIDENT_TREES_H

/* How a tree node reads its value (flatten.Node.access): from the call's bound parameters, a
 * dict item, a tuple or list index, an instance dict's attribute, the bound method's self; and,
 * in state trees (Note [State guards] in lower/state/), which read what a function reads outside
 * its arguments, a root object, getattr, getitem, a closure cell's contents. */
enum trt_tree_access {
  TRT_ACC_ARG = 0,
  TRT_ACC_ITEM = 1,
  TRT_ACC_INDEX = 2,
  TRT_ACC_ATTR = 3,
  TRT_ACC_SELF = 4,
  TRT_ACC_ROOT = 5,
  TRT_ACC_GETATTR = 6,
  TRT_ACC_GETITEM = 7,
  TRT_ACC_CELL = 8,
};

/* What a tree node checks of its value (flatten.Node.check); TYPE, ABSENT and TENSOR are
 * state trees' checks. */
enum trt_tree_check {
  TRT_CHK_LEAF = 0,
  TRT_CHK_SEQ = 1,
  TRT_CHK_DICT = 2,
  TRT_CHK_OBJECT = 3,
  TRT_CHK_CONST = 4,
  TRT_CHK_ID = 5,
  TRT_CHK_SAME = 6,
  TRT_CHK_TYPE = 7,
  TRT_CHK_ABSENT = 8,
  TRT_CHK_TENSOR = 9,
};

/* An output recipe's ops (flatten.OutputRecipe; build_op in recipes.cpp). */
enum trt_recipe_op {
  TRT_R_VALUE = 0,
  TRT_R_CONST = 1,
  TRT_R_INPUT = 2,
  TRT_R_TUPLE = 3,
  TRT_R_LIST = 4,
  TRT_R_DICT = 5,
  TRT_R_NAMEDTUPLE = 6,
  TRT_R_OBJECT = 7,
  TRT_R_AGAIN = 8,
  TRT_R_BUILT = 9,
  TRT_R_STRUCTSEQ = 10,
  TRT_R_WRITE = 11, /* after the result: Note [Attribute writes] in lower/writes.py */
};

/* R_OBJECT's base: how the object is made without running its Python __init__. */
enum trt_recipe_base {
  TRT_BASE_OBJECT = 0,
  TRT_BASE_DICT = 1,
  TRT_BASE_ODICT = 2,
};

#endif /* TRIDENT_TREES_H */
